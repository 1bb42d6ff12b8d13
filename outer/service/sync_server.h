// The outer-sync service's logic, independent of any transport: membership, sync rounds, the fp32
// master copy of the global parameters and the outer optimizer. The gRPC services in src/ and the
// in-process transport of the tests both call it.
//
// SyncServer is the service's one face; its work is done by parts over a shared core
// (outer/service/service_core.h), each in its own files:
//   MembershipDesk  joins, heartbeats, leaves, leases; what the service shows of the run
//   Rounds          pushes, token claims, commits of rounds, the islands' wait for them
//   StateStore      state fetches, durable snapshots and their restore, the durability gate
//   ShardLink       a sharded service: the coordinator's and the shards' calls to each other
//   MomentDesk      the islands' optimizer moments, averaged every outer.moment_sync_every rounds
// (How a round commits: outer/service/rounds.h.)
//
// Thread-safe: every method may be called from any thread (gRPC handler threads).
#ifndef ATOLL_OUTER_SERVICE_SYNC_SERVER_H_
#define ATOLL_OUTER_SERVICE_SYNC_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "atoll/v1/service_state.pb.h"
#include "outer/service/membership_desk.h"
#include "outer/service/moment_desk.h"
#include "outer/service/rounds.h"
#include "outer/service/service_core.h"
#include "outer/service/shard_link.h"
#include "outer/service/state_store.h"
#include "outer/service/sync_types.h"

namespace atl::outer {

// Each fragment has its own global parameters, outer optimizer state and rounds; membership is
// shared. Streaming DiLoCo syncs fragments at staggered steps, plain DiLoCo has one fragment.
class SyncServer {
 public:
  SyncServer(SyncServerOptions options, FragmentLayout layout, std::vector<float> initial);
  SyncServer(SyncServerOptions options, std::vector<FragmentLayout> layouts,
             std::vector<std::vector<float>> initial);

  static constexpr uint32_t kMaxDataParallel = MembershipDesk::kMaxDataParallel;
  static constexpr double kClaimFlagFactor = Rounds::kClaimFlagFactor;
  static constexpr double kClaimMinWindowS = Rounds::kClaimMinWindowS;

  // ---- membership (MembershipDesk)
  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request) { return desk_.Join(request); }
  // OK when `island` is a member and `session` its credential (see Membership::Authenticate).
  absl::Status Authenticate(const std::string& island, const std::string& session) const {
    return desk_.Authenticate(island, session);
  }
  absl::Status Leave(const pb::LeaveRequest& request) { return desk_.Leave(request); }
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request) {
    return desk_.Heartbeat(request);
  }
  pb::GetStateResponse GetState() const { return desk_.GetState(); }
  // Commits the open round if its deadline has passed with enough contributions, and drops
  // members whose lease has run out.
  void Tick(absl::Time now) { desk_.Tick(now); }
  size_t num_members() const { return desk_.num_members(); }
  // Whether `name` is a member or a former member still remembered (an island coming back).
  bool KnowsIsland(const std::string& name) const { return desk_.KnowsIsland(name); }
  // What the service knows of the run now (status page, metrics): members with their latest
  // heartbeat and telemetry, former members with their end state.
  using IslandStatus = outer::IslandStatus;
  using Status = ServiceStatus;
  Status GetStatus() const { return desk_.GetStatus(); }

  // ---- rounds (Rounds)
  // One island's contribution arrives as the stream of a Push call: OpenPush with its first
  // message, PushStream::Add with every message (the first included), FinishPush at its end. The
  // contribution is verified completely before anything is recorded; refusals name the problem:
  //   NOT_FOUND unknown run or fragment, PERMISSION_DENIED not a member, FAILED_PRECONDITION
  //   committed or unknown round, or (async) unknown or too stale a version (fetch the state),
  //   ALREADY_EXISTS duplicate, UNAVAILABLE another push of this island and fragment is under way,
  //   DATA_LOSS checksum, INVALID_ARGUMENT sizes, ranges, chunk order, codec or non-finite values.
  // A push naming moments (PushRequest.moments) goes to the MomentDesk instead.
  absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const pb::PushRequest& first) {
    if (!first.moments().empty()) return moments_.OpenPush(first, &rounds_);
    return rounds_.OpenPush(first);
  }
  absl::StatusOr<pb::PushResponse> FinishPush(std::unique_ptr<PushStream> stream) {
    if (stream != nullptr && !stream->moments().empty()) {
      return moments_.FinishPush(std::move(stream));
    }
    return rounds_.FinishPush(std::move(stream));
  }
  // The three steps on a whole payload (the in-process transport and tests).
  absl::StatusOr<pb::PushResponse> Push(const std::vector<pb::PushRequest>& requests);
  // Before a push's message is read into a request: lends the chunk's data the buffer of a
  // committed sparse contribution (memory already mapped) when one is kept, so that parsing the
  // message writes no fresh pages.
  void LendBuffer(pb::PushRequest* request) {
    rounds_.LendBuffer(request->mutable_chunk()->mutable_data());
  }
  // AwaitRound for a member presenting its session (UpdateRequest names island, round, fragment).
  // ABORTED when the round is the one a resumed service opened and holds nothing of the member's
  // for the range: its push went to the process that died before the round was durable, and the
  // round may wait for it (the island pushes again). `cancelled`, when given, is polled while
  // waiting (a caller that went away frees its thread within kCancelPoll, not at the deadline):
  // CANCELLED.
  static constexpr absl::Duration kCancelPoll = outer::kCancelPoll;
  absl::StatusOr<std::shared_ptr<const CommittedRound>> AwaitUpdate(
      const pb::UpdateRequest& request, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr) {
    return rounds_.AwaitUpdate(request, deadline, cancelled);
  }
  // Blocks until `round` has committed (or returns at once if it has), or until `deadline`
  // (DEADLINE_EXCEEDED). Rounds older than the few kept answer FAILED_PRECONDITION.
  absl::StatusOr<std::shared_ptr<const CommittedRound>> AwaitRound(
      uint64_t round, absl::Time deadline, uint32_t fragment = 0,
      const std::function<bool()>& cancelled = nullptr) {
    return rounds_.AwaitRound(round, deadline, fragment, cancelled);
  }
  // Tests: called by a commit while it holds its fragment's data lock, before its data work (to
  // hold a commit in progress and see what waits for it).
  void SetCommitHookForTesting(std::function<void(uint32_t fragment)> hook) {
    rounds_.SetCommitHookForTesting(std::move(hook));
  }

  // ---- state (StateStore)
  // Streams the current global parameters (fp32) within [offset, offset + n) to `write`, chunk by
  // chunk: each chunk is encoded from the live parameters under the fragment's data lock (no copy
  // of the range is made, a commit waits at most one chunk). A round committed while the range is
  // streamed ends the stream with ABORTED (fetch again); `write` returning false (the caller went
  // away) with CANCELLED.
  // A request naming moments (FetchStateRequest.moments) streams their average instead
  // (MomentDesk::FetchMoments).
  absl::Status FetchState(const pb::FetchStateRequest& request,
                          const std::function<bool(pb::StateChunk&&)>& write) {
    if (!request.moments().empty()) return moments_.FetchMoments(request, write);
    return state_.FetchState(request, write);
  }
  // The round of fragment f's newest moment average (-1: none).
  int64_t moments_round(uint32_t fragment = 0) const { return moments_.published_round(fragment); }
  // Durable state, tensor by tensor (outer/service/state_store.h).
  static constexpr const char* kParamsTensor = StateStore::kParamsTensor;
  using StateWrite = StateStore::StateWrite;
  using StateRead = StateStore::StateRead;
  absl::StatusOr<pb::ServiceState> Snapshot(const StateWrite& write) const {
    return state_.Snapshot(write);
  }
  absl::Status Restore(const pb::ServiceState& description, const StateRead& read) {
    return state_.Restore(description, read);
  }
  void SetDurabilityGate(bool on) { state_.SetDurabilityGate(on); }
  void MarkDurable(const pb::ServiceState& written) { state_.MarkDurable(written); }

  // ---- shards (ShardLink)
  // On the coordinator (control plane): a shard server's call. The shard is recorded (its
  // address, its rounds, the islands it heard from, whose leases this renews), and once the
  // membership epoch differs from the one the shard knows, or at `deadline`, the membership is
  // returned. Refused: NOT_FOUND another run, FAILED_PRECONDITION another model config or shard
  // count, INVALID_ARGUMENT a shard index, address or round count out of place. Joins wait
  // (UNAVAILABLE) until every shard has called.
  absl::StatusOr<pb::ShardSyncResponse> ShardSync(const pb::ShardSyncRequest& request,
                                                  absl::Time deadline) {
    return shards_.ShardSync(request, deadline);
  }
  // On a shard server: what it tells the coordinator (rounds, islands heard from since the last
  // call), and the membership it answered, applied (rounds that waited only for islands that left
  // commit now).
  pb::ShardSyncRequest ShardReport(const std::string& address) { return shards_.ShardReport(address); }
  void MirrorMembership(const pb::ShardSyncResponse& view) { shards_.MirrorMembership(view); }
  bool is_control_plane() const { return core_.is_control_plane(); }
  bool is_shard() const { return core_.is_shard(); }

  // ---- events and figures
  // Called (under the server's lock: keep it short) after each commit is published.
  void SetCommitListener(std::function<void(const CommittedRound&)> listener);
  // Called (under the lock) with a line for each membership event worth logging.
  void SetEventListener(std::function<void(const std::string&)> listener);
  uint64_t round(uint32_t fragment = 0) const;
  uint64_t params_hash(uint32_t fragment = 0) const;
  std::vector<float> params(uint32_t fragment = 0) const;  // a copy (tests, tools)
  // The outer optimizer's state tensors, in order (a copy, for tests).
  std::vector<std::vector<float>> optimizer_state(uint32_t fragment = 0) const;
  uint32_t num_fragments() const { return uint32_t(core_.fragments.size()); }
  const FragmentLayout& layout(uint32_t fragment = 0) const {
    return core_.fragments[fragment].layout;
  }
  // Rounds (versions in async mode) committed over all fragments.
  uint64_t committed_rounds() const;
  // Async: whether fragment 0's contributions have reached the token budget.
  bool budget_reached() const;
  const SyncServerOptions& options() const { return core_.options; }

 private:
  ServiceCore core_;
  Rounds rounds_;
  MembershipDesk desk_;
  StateStore state_;
  ShardLink shards_;
  MomentDesk moments_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SYNC_SERVER_H_
