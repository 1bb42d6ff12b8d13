// outer::Transport over gRPC: the island's client of the coordinator. Every call carries the run
// token and a deadline (rpc_timeout_s; waiting for a round's commit gets round_timeout_s on top).
// With `connections` > 1 it holds that many channels, each its own TCP connection: data calls go
// on the channel of their lane, membership calls on the first.
#ifndef ATOLL_SRC_NET_GRPC_TRANSPORT_H_
#define ATOLL_SRC_NET_GRPC_TRANSPORT_H_

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/outer_config.h"
#include "outer/base/transport.h"
#include "src/net/rpc_security.h"

namespace atl {

namespace pb = ::atollpb::v1;

struct GrpcTransportOptions {
  std::string target;  // host:port of the coordinator
  std::string token;
  TlsFiles tls;
  double rpc_timeout_s = 60;
  double round_timeout_s = 600;
  int connections = 1;  // TCP connections to the service (outer.connections)
};

// An island's connection to its run: the coordinator at `target`, and each fragment's shard of a
// sharded service (outer::ShardRouter), with the timeouts and connections of its [outer] section.
absl::StatusOr<std::unique_ptr<outer::Transport>> ConnectIsland(const std::string& target,
                                                                const std::string& token,
                                                                const TlsFiles& tls,
                                                                const outer::OuterConfig& outer);

class GrpcTransport : public outer::Transport {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(const GrpcTransportOptions& options);
  ~GrpcTransport() override;

  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request) override;
  absl::Status Leave(const pb::LeaveRequest& request) override;
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request) override;
  absl::StatusOr<pb::GetStateResponse> GetState(const pb::GetStateRequest& request);
  // A shard server's call to its coordinator (answered within about a second: a long poll).
  absl::StatusOr<pb::ShardSyncResponse> ShardSync(const pb::ShardSyncRequest& request);
  int connections() const override { return int(stubs_.size()); }
  std::string address() const override { return options_.target; }
  absl::StatusOr<pb::PushResponse> Push(const outer::PushSource& source, int lane) override;
  absl::Status AwaitUpdate(const pb::UpdateRequest& request,
                           const outer::ChunkSink<pb::UpdateChunk>& sink, int lane) override;
  absl::Status FetchState(const pb::FetchStateRequest& request,
                          const outer::ChunkSink<pb::StateChunk>& sink, int lane) override;
  void Cancel() override;

 private:
  struct Stubs;
  class Call;
  explicit GrpcTransport(const GrpcTransportOptions& options);
  GrpcTransportOptions options_;
  const Stubs& Lane(int lane) const;
  std::vector<std::unique_ptr<Stubs>> stubs_;  // one per connection
  std::unique_ptr<Stubs> control_;             // membership calls: a connection of their own
  std::mutex calls_mu_;
  std::set<grpc::ClientContext*> calls_;  // in flight, for Cancel
  bool cancelled_ = false;                // guarded by calls_mu_
};

}  // namespace atl

#endif  // ATOLL_SRC_NET_GRPC_TRANSPORT_H_
