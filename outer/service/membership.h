// Who takes part in a run, in which state, and from which round each island is waited for.
// Transport-independent, clock passed in: unit-tested without a network.
//
// States and transitions:
//
//   (Join) --> joining --(first accepted contribution)--> active
//                 |                                          |
//                 +--(Leave: goodbye)--> leaving <------------+
//                 +--(lease expired)---> dead    <------------+
//
// joining: accepted and handed a data stream; the island is fetching the global state. It is not
//   waited for until `required_from` (the round after the one open when it joined; round 0 for
//   islands that join before the first commit), so running islands never pause for a join.
// active: contributes every round; waited for in every round.
// leaving / dead: terminal. The member is removed at once (its data stream is free again); the
//   name is remembered with its end state, so a silent island that comes back is told why it is no
//   longer a member and rejoins (fetching the state) under the same name.
// A lease is renewed by every heartbeat and every contribution; a member silent for longer than
// `lease` is dead.
// Identity: each join hands the member a fresh session credential; every later call must name the
// member and present it (Authenticate). A rejoin gets a new one; the old one is worthless.
// Names are checked (ValidateName) and the end states of former members are remembered for the
// newest kMaxDeparted names only, so memory stays bounded whatever peers do.
// Mirroring: the shard servers of a sharded service decide nothing about membership; they mirror
// the coordinator's (Mirror). A mirror's view lags the coordinator by one call, so a name or
// session it does not know yet is UNAVAILABLE (retry), never the refusal that sends an island to
// rejoin; its leases never expire (the coordinator's do), and it collects the names it heard
// from (TakeHeard) for the coordinator, whose leases they renew.
#ifndef ATOLL_OUTER_SERVICE_MEMBERSHIP_H_
#define ATOLL_OUTER_SERVICE_MEMBERSHIP_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "atoll/v1/outer.pb.h"

namespace atl::outer {

namespace pb = ::atollpb::v1;

enum class MemberState { kJoining, kActive, kLeaving, kDead };
const char* StateName(MemberState state);
// Whether `from` may move to `to` (the arrows above).
bool TransitionAllowed(MemberState from, MemberState to);

struct Member {
  std::string name;
  uint32_t data_stream = 0;
  MemberState state = MemberState::kJoining;
  std::vector<uint64_t> required_from;  // per fragment: first round this member is waited for
  absl::Time last_seen;
  bool finished = false;  // async: pushed its last contribution
  std::string session;    // credential handed out at join (a mirror: its SHA-256, hex)
  uint32_t data_parallel = 1;  // its data-parallel ranks, as declared at join
  // For the bound on the tokens it claims (SyncServer::CheckClaimLocked): the earliest step it can
  // have resumed from when it joined (-1: not set yet), and the fragments it has contributed to
  // since; a first contribution may reach back to that step, later ones cover their round only.
  int64_t resume_floor = -1;
  std::vector<bool> contributed;
  // For flagging claims above its throughput (SyncServer::FlagClaimLocked): the tokens its
  // contributions have claimed (summed over the fragments), the highest throughput its heartbeats
  // reported (per second of compute), and how many of its contributions were flagged. Each
  // fragment's first contribution may hold work from before the join (a rejoin after a lost link
  // or a coordinator restart): the flag counts from the first contribution, without those.
  uint64_t tokens_claimed = 0;
  uint64_t tokens_first = 0;                   // of the first contribution of each fragment
  std::optional<absl::Time> first_contribution_at;
  double peak_tokens_per_s = 0;
  uint32_t flagged_claims = 0;
  uint64_t inner_step = 0;             // as of its latest heartbeat
  pb::IslandTelemetry telemetry;       // likewise
};

class Membership {
 public:
  static constexpr size_t kMaxDeparted = 1024;

  Membership(uint32_t num_data_streams, absl::Duration lease);

  // Makes this a mirror (see above) and replaces the members by `view`'s: a new name, or a member
  // whose session changed (it rejoined), is adopted as Join would take it (`rounds`,
  // `first_rounds`); members missing from the view depart with the end state it gives (dead when
  // it gives none). Returns the names that departed.
  std::vector<std::string> Mirror(const pb::ShardSyncResponse& view,
                                  const std::vector<uint64_t>& rounds, absl::Time now,
                                  const std::vector<uint64_t>& first_rounds);
  bool mirror() const { return mirror_; }
  // A mirror: the names heard from (heartbeats, contributions) since the last call.
  std::vector<std::string> TakeHeard();
  // The view a mirror receives: members, their sessions, former members' end states.
  void FillView(pb::ShardSyncResponse* view) const;

  // `rounds`: the open round of each fragment; `first_rounds`: the round each fragment started
  // (or resumed) at, in which every island that joins is waited for. `preferred_stream` (if free)
  // keeps an island that rejoins on its data. Refuses a name that is a current member
  // (ALREADY_EXISTS) and a run whose data streams are all taken (RESOURCE_EXHAUSTED).
  absl::StatusOr<Member> Join(const std::string& name, int preferred_stream,
                              const std::vector<uint64_t>& rounds, absl::Time now,
                              const std::vector<uint64_t>& first_rounds = {});
  // Renews the lease. NOT_FOUND names why a non-member is not one.
  absl::Status Heartbeat(const std::string& name, absl::Time now);
  // A contribution was accepted: renews the lease; joining -> active.
  absl::Status Contributed(const std::string& name, absl::Time now);
  absl::Status Leave(const std::string& name);
  // Members silent for longer than the lease become dead and are removed; returns their names.
  // A mirror's never expire.
  std::vector<std::string> ExpireLeases(absl::Time now);

  // OK for a member; PERMISSION_DENIED (naming the end state when known) otherwise.
  absl::Status CheckMember(const std::string& name) const;
  // OK for a member presenting its session credential; UNAUTHENTICATED for a member presenting
  // anything else; CheckMember's refusal for a non-member.
  absl::Status Authenticate(const std::string& name, const std::string& session) const;
  const Member* Find(const std::string& name) const;
  Member* FindMutable(const std::string& name);
  // Whether round `round` of `fragment` waits for this member.
  static bool Required(const Member& m, uint32_t fragment, uint64_t round);

  const std::map<std::string, Member>& members() const { return members_; }
  size_t size() const { return members_.size(); }
  size_t departed() const { return departed_.size(); }
  const std::map<std::string, MemberState>& departed_states() const { return departed_; }
  uint64_t epoch() const { return epoch_; }
  absl::Duration lease() const { return lease_; }

 private:
  absl::Status Move(Member& m, MemberState to);

  uint32_t num_data_streams_;
  absl::Duration lease_;
  uint64_t epoch_ = 0;                          // changes with every join and departure
  std::map<std::string, Member> members_;       // by name (the island id)
  void Depart(const std::string& name, MemberState state);

  std::map<std::string, MemberState> departed_;  // end state of former members, by name
  std::deque<std::string> departed_order_;       // oldest first, for the bound
  bool mirror_ = false;
  std::set<std::string> heard_;  // a mirror: heard from since TakeHeard
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_MEMBERSHIP_H_
