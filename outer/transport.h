// The island's view of the coordinator and outer-sync service. Implemented over gRPC (src/) and in
// process (InProcessTransport, for tests); every call is bounded by the implementation's deadline.
#ifndef ATOLL_OUTER_TRANSPORT_H_
#define ATOLL_OUTER_TRANSPORT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "atoll/v1/outer.pb.h"

namespace atl::outer {

namespace pb = ::atollpb::v1;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request) = 0;
  virtual absl::Status Leave(const pb::LeaveRequest& request) = 0;
  virtual absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request) = 0;
  virtual absl::StatusOr<pb::PushResponse> Push(const std::vector<pb::PushRequest>& requests) = 0;
  virtual absl::StatusOr<std::vector<pb::UpdateChunk>> AwaitUpdate(
      const pb::UpdateRequest& request) = 0;
  virtual absl::StatusOr<std::vector<pb::StateChunk>> FetchState(
      const pb::FetchStateRequest& request) = 0;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_TRANSPORT_H_
