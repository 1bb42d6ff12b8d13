// The service's membership calls: islands join (checked against the run: its model, its shards),
// heartbeat (their telemetry checked), leave, or go silent past their lease and are dropped; and
// what the service shows of the run (the status page and metrics, GetState). A part of the sync
// server (outer/service/sync_server.h): the membership state machine itself is
// outer/service/membership.h; a change of membership may complete rounds, which the rounds part
// then commits.
#ifndef ATOLL_OUTER_SERVICE_MEMBERSHIP_DESK_H_
#define ATOLL_OUTER_SERVICE_MEMBERSHIP_DESK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "outer/service/rounds.h"
#include "outer/service/service_core.h"

namespace atl::outer {

class MembershipDesk {
 public:
  MembershipDesk(ServiceCore& core, Rounds& rounds) : core_(core), rounds_(rounds) {}

  // An island declares its data-parallel ranks at join (JoinRequest.data_parallel): at most this.
  static constexpr uint32_t kMaxDataParallel = 1 << 20;

  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request);
  absl::Status Authenticate(const std::string& island, const std::string& session) const;
  absl::Status Leave(const pb::LeaveRequest& request);
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request);
  // Drops members whose lease has run out, and commits the rounds that are ready.
  void Tick(absl::Time now);

  pb::GetStateResponse GetState() const;
  ServiceStatus GetStatus() const;
  size_t num_members() const;
  bool KnowsIsland(const std::string& name) const;

 private:
  // A shard server refuses joins, heartbeats and leaves (the coordinator takes them).
  absl::Status CheckMembershipCall() const;
  // Where a refused joiner's parameters first differ from the run's (a sentence, or empty).
  std::string LayoutDifference(const pb::JoinRequest& request) const;
  // A member must present its session; a non-member passes (the caller refuses it its own way).
  absl::Status AuthenticateMemberLocked(const std::string& island, const std::string& session) const;
  // A heartbeat's count of members that have not finished; at a sharded run's end, of the shards
  // whose final rounds are not yet known (ServiceCore::EndReports).
  uint32_t TrainingLocked();
  // The answer to a join.
  pb::JoinResponse JoinedLocked(const pb::JoinRequest& request, const Member& m) const;

  ServiceCore& core_;
  Rounds& rounds_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_MEMBERSHIP_DESK_H_
