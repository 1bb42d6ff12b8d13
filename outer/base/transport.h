// The island's view of the coordinator and outer-sync service. Implemented over gRPC (src/) and in
// process (InProcessTransport, for tests); every call is bounded by the implementation's deadline.
//
// Payloads stream: a push pulls its messages from a source one at a time (the island encodes each
// chunk as it is sent), and updates and state transfers hand each chunk to a sink as it arrives
// (the island verifies and applies it). Neither side of a transport holds a whole payload.
//
// Lanes: a transport may hold several connections to the service (outer.connections). A data call
// names its lane; calls on different lanes (mod connections()) travel on different connections, so
// an island can stripe one payload over several TCP streams by running calls in parallel.
#ifndef ATOLL_OUTER_BASE_TRANSPORT_H_
#define ATOLL_OUTER_BASE_TRANSPORT_H_

#include <functional>

#include "absl/status/statusor.h"
#include "atoll/v1/outer.pb.h"

namespace atl::outer {

namespace pb = ::atollpb::v1;

// Writes the next message of a push into *next and returns true, or returns false after the last.
// An error ends the push with it (the service discards what it received). A retried push is given
// a fresh source.
using PushSource = std::function<absl::StatusOr<bool>(pb::PushRequest* next)>;
// Takes each chunk of a stream as it arrives; an error ends the call with that error.
template <typename Chunk>
using ChunkSink = std::function<absl::Status(Chunk&& chunk)>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request) = 0;
  virtual absl::Status Leave(const pb::LeaveRequest& request) = 0;
  virtual absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request) = 0;
  // Where the run's data lives, as the join answered (every rank of the island is told, after a
  // join and a rejoin): a transport to a sharded service sends each fragment's data calls to its
  // shard (ShardRouter); others have nothing to do.
  virtual void Route(const pb::JoinResponse& joined) { (void)joined; }
  // Connections to the service: lanes 0 .. connections() - 1 are distinct.
  virtual int connections() const { return 1; }
  // The service's address, for messages ("" when it has none, e.g. in-process).
  virtual std::string address() const { return ""; }
  virtual absl::StatusOr<pb::PushResponse> Push(const PushSource& source, int lane) = 0;
  virtual absl::Status AwaitUpdate(const pb::UpdateRequest& request,
                                   const ChunkSink<pb::UpdateChunk>& sink, int lane) = 0;
  virtual absl::Status FetchState(const pb::FetchStateRequest& request,
                                  const ChunkSink<pb::StateChunk>& sink, int lane) = 0;
  // Ends every call in flight and refuses every later one, with CANCELLED: the island goes away
  // without waiting for them (a Python island interrupted by Ctrl-C). Thread-safe, idempotent.
  virtual void Cancel() {}
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_TRANSPORT_H_
