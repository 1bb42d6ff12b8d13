// Transport that calls a SyncServer in the same process: the reference for the gRPC transport and
// the fast path of algorithm tests.
#ifndef ATOLL_OUTER_SERVICE_IN_PROCESS_TRANSPORT_H_
#define ATOLL_OUTER_SERVICE_IN_PROCESS_TRANSPORT_H_

#include "outer/service/sync_server.h"
#include "outer/base/transport.h"

namespace atl::outer {

class InProcessTransport : public Transport {
 public:
  // `connections`: the lanes it reports (calls on them run at once, as over several connections).
  explicit InProcessTransport(SyncServer* server, absl::Duration deadline = absl::Seconds(60),
                              int connections = 1)
      : server_(server), deadline_(deadline), connections_(connections) {}
  int connections() const override { return connections_; }

  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& r) override {
    return server_->Join(r);
  }
  absl::Status Leave(const pb::LeaveRequest& r) override { return server_->Leave(r); }
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& r) override {
    return server_->Heartbeat(r);
  }
  absl::StatusOr<pb::PushResponse> Push(const PushSource& source, int lane) override;
  absl::Status AwaitUpdate(const pb::UpdateRequest& r, const ChunkSink<pb::UpdateChunk>& sink,
                           int lane) override;
  absl::Status FetchState(const pb::FetchStateRequest& r, const ChunkSink<pb::StateChunk>& sink,
                          int lane) override;

 private:
  SyncServer* server_;
  absl::Duration deadline_;
  int connections_;
};

// Waits for the round the request names to be released, then streams its update chunks (of the
// range asked for) to `write` one at a time, as the OuterSync service sends them: no copy of the
// update is made per caller. `write` returning false (the caller went away) ends it with CANCELLED.
absl::Status StreamUpdate(SyncServer& server, const pb::UpdateRequest& request,
                          absl::Time deadline, const std::function<bool()>& cancelled,
                          const std::function<bool(pb::UpdateChunk&&)>& write);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_IN_PROCESS_TRANSPORT_H_
