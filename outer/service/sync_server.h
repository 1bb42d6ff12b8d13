// The outer-sync service's logic, independent of any transport: membership, sync rounds, the fp32
// master copy of the global parameters and the outer optimizer. The gRPC services in src/ and the
// in-process transport of the tests both call it.
//
// A round commits when every current member has contributed (the first round also waits until the
// run's num_data_streams islands have joined), or once its deadline has passed with at least
// min_islands contributions. At commit the service averages the pseudo-gradients weighted
// by tokens (in island-id order, so the result does not depend on arrival order), runs the outer
// optimizer, applies the update to its own copy and keeps the encoded update for the islands,
// which apply the same update to theirs and check the hash of the result.
//
// Thread-safe: every method may be called from any thread (gRPC handler threads).
#ifndef ATOLL_OUTER_SERVICE_SYNC_SERVER_H_
#define ATOLL_OUTER_SERVICE_SYNC_SERVER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "outer/base/aggregation.h"
#include "outer/service/auto_tune.h"
#include "outer/base/fragment_data.h"
#include "outer/base/fragments.h"
#include "outer/service/log_limiter.h"
#include "outer/service/membership.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/payload.h"
#include "outer/base/update_recipe.h"
#include "outer/base/worker_pool.h"
#include "atoll/v1/service_state.pb.h"

namespace atl::outer {

struct SyncServerOptions {
  std::string run_id = "run";
  OuterOptimizerConfig optimizer;
  int min_islands = 1;             // contributions needed to commit at the deadline
  double round_timeout_s = 600;    // deadline, counted from a round's first contribution
  uint32_t sync_every = 100;       // H, told to islands at join
  uint64_t total_inner_steps = 0;  // told to islands at join
  SyncPhases phases;               // sync: warm start (plain averages) and early H, told at join
  uint32_t num_data_streams = 1;   // the run's islands: disjoint data streams handed out at join
  uint64_t config_hash = 0;        // islands with another model config are refused
  double lease_s = 5;              // a member silent for this long is dead and dropped
  size_t chunk_bytes = kDefaultChunkBytes;
  // Codec of pseudo-gradients and outer updates. Full state always travels as fp32.
  compression::CodecSpec codec = {compression::Codec::kFp32, 0};
  // Async mode: every contribution is applied as it arrives (one version per contribution, with
  // the optimizer's delayed Nesterov); there are no rounds to wait for.
  bool async = false;
  uint32_t max_staleness = 16;      // versions; staler contributions are refused
  bool staleness_scaling = false;   // scale a contribution by 1 / (1 + staleness)
  bool dynamic_local_steps = true;  // DyLU: each island's H follows its measured throughput
  uint64_t token_budget = 0;        // tokens over all islands after which islands finish (0: none)
  // Threads for a commit's data work (aggregation, the outer step, encoding, hashing); commits run
  // outside the lock that membership, heartbeats and pushes take.
  int service_threads = 1;
  AggregationOptions aggregation;   // how a round's contributions are combined
  // Bounds on a contribution, refused with INVALID_ARGUMENT beyond them (0: no bound): its L2 norm
  // relative to the fragment's parameter norm and the magnitude of any of its values.
  double max_update_norm = 0;
  double max_update_value = 0;
  // The tokens one data-parallel rank trains in one inner step (batch x accumulation x context;
  // 0: claims unbounded). A contribution may claim at most its round's steps (ClaimBound) x this x
  // the island's declared data-parallel ranks: the weight of a contribution follows the round
  // actually run (a warm-start round is one step), whatever a peer claims.
  uint64_t tokens_per_step = 0;
  // Sync mode: choose tau for the islands from their measured throughput and links, to reach this
  // compute utilization (outer/service/auto_tune.h). 0: off (islands keep their configured tau).
  double auto_tune_target = 0;
  double auto_tune_headroom = 1;    // as if transfers took this many times as long as measured
  // A sharded service (num_shards > 1): fragment f lives on shard f % num_shards. The coordinator
  // (shard = kControlPlane) keeps membership and the schedule and holds no fragment's data; a
  // shard server (shard 0 .. num_shards - 1) holds its fragments, mirrors the coordinator's
  // membership (MirrorMembership) and refuses membership calls.
  static constexpr int kControlPlane = -1;
  uint32_t num_shards = 1;
  int shard = 0;
};

// Whether `fragment` lives on `shard` (always, unsharded).
bool ShardOwns(const SyncServerOptions& options, uint32_t fragment);

// Dynamic local updates (arXiv 2401.09135): an island running at `v` inner steps/s while the
// fastest runs at `v_max` syncs every max(1, floor(v / v_max * h)) steps, so all islands push at
// about the same wall-clock rate.
uint32_t DynamicLocalSteps(double v, double v_max, uint32_t h);

// The parameters that make up one fragment (the whole model when there is one), in flat order.
struct FragmentLayout {
  std::vector<std::string> names;
  std::vector<uint64_t> numels;
  uint64_t total() const;
};

class SyncServer;

// An island's telemetry is shown, never used: values that are not finite or out of their range
// (loss and val_loss in [0, 1e4], tokens_per_s in [0, 1e12], utilization in [0, 1]) are refused
// with INVALID_ARGUMENT naming the field, so a broken island cannot put garbage on the page.
absl::Status ValidateTelemetry(const pb::IslandTelemetry& telemetry);

// One Push call in progress on the service: opened after the cheap checks (run, fragment, member,
// round), fed message by message (each chunk checked before its bytes are kept: see ChunkStream),
// finished by SyncServer::FinishPush. At most one per island and fragment is open at a time.
class PushStream {
 public:
  ~PushStream();
  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  absl::Status Add(pb::PushRequest&& request);
  const std::string& island() const { return chunks_.id().island_id; }

 private:
  friend class SyncServer;
  PushStream(SyncServer* server, ChunkStream chunks, uint64_t first_offset, std::string session,
             uint64_t tokens, IslandFigures figures);

  SyncServer* server_;
  ChunkStream chunks_;
  uint64_t first_offset_;  // with the island and fragment, the key of the open push
  std::string session_;
  uint64_t tokens_;
  IslandFigures figures_;
};

// A committed round, as every island receives it.
struct CommittedRound {
  uint64_t round = 0;
  uint32_t fragment = 0;
  // The update u (theta_new = theta - u, every copy subtracting the decoded chunks), encoded once
  // and kept only so. Or, when `recipe` has terms, u is relayed: each copy makes it from the
  // contributions (`relayed`, one per term, in `relayed_codec`) by the recipe
  // (outer/base/update_recipe.h).
  std::vector<pb::Chunk> update_chunks;
  UpdateRecipe recipe;
  std::vector<std::shared_ptr<const EncodedPayload>> relayed;
  compression::CodecSpec relayed_codec;
  uint64_t update_bytes = 0;  // of the chunks' (or the relayed payloads') data
  uint64_t params_hash = 0;            // XXH64 of the fp32 global parameters after the update
  std::vector<std::string> contributors;
  uint64_t tokens = 0;
  double commit_unix_s = 0;
  uint64_t staleness = 0;  // async: versions between the contribution's start and its arrival
  double round_s = 0;   // from the round's first contribution to its commit
  double commit_s = 0;  // the commit's data work: aggregation, outer step, encoding, hashing
  // Islands whose contributions were left out because the combination would have made the
  // parameters non-finite (largest norm first), and what the aggregation rule did.
  std::vector<std::string> dropped;
  AggregationReport aggregation;
  // Each contribution's L2 norm over the fragment's parameter norm before the round (a drifting or
  // broken island shows here first; outer.max_update_norm bounds it).
  std::map<std::string, double> relative_norms;
  // XXH64 of the parameters after the round over every range islands' ranks own (as seen in their
  // pushes and state fetches): each rank checks its range against these.
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> range_hashes;
};

// Each fragment has its own global parameters, outer optimizer state and rounds; membership is
// shared. Streaming DiLoCo syncs fragments at staggered steps, plain DiLoCo has one fragment.
class SyncServer {
 public:
  SyncServer(SyncServerOptions options, FragmentLayout layout, std::vector<float> initial);
  SyncServer(SyncServerOptions options, std::vector<FragmentLayout> layouts,
             std::vector<std::vector<float>> initial);

  // An island declares its data-parallel ranks at join (JoinRequest.data_parallel): at most this.
  static constexpr uint32_t kMaxDataParallel = 1 << 20;
  // A member's claims since it joined are flagged past this many times what the highest
  // throughput its heartbeats reported could have trained in that time (an honest island's are at
  // most about 1x: its claims count the steps it trained, its throughput their wall-clock rate).
  static constexpr double kClaimFlagFactor = 3.0;
  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& request);
  // OK when `island` is a member and `session` its credential (see Membership::Authenticate).
  absl::Status Authenticate(const std::string& island, const std::string& session) const;
  absl::Status Leave(const pb::LeaveRequest& request);
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& request);
  pb::GetStateResponse GetState() const;

  // One island's contribution arrives as the stream of a Push call: OpenPush with its first
  // message, PushStream::Add with every message (the first included), FinishPush at its end. The
  // contribution is verified completely before anything is recorded; refusals name the problem:
  //   NOT_FOUND unknown run or fragment, PERMISSION_DENIED not a member, FAILED_PRECONDITION
  //   committed or unknown round, or (async) unknown or too stale a version (fetch the state),
  //   ALREADY_EXISTS duplicate, UNAVAILABLE another push of this island and fragment is under way,
  //   DATA_LOSS checksum, INVALID_ARGUMENT sizes, ranges, chunk order, codec or non-finite values.
  absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const pb::PushRequest& first);
  absl::StatusOr<pb::PushResponse> FinishPush(std::unique_ptr<PushStream> stream);
  // The three steps on a whole payload (the in-process transport and tests).
  absl::StatusOr<pb::PushResponse> Push(const std::vector<pb::PushRequest>& requests);

  // AwaitRound for a member presenting its session (UpdateRequest names island, round, fragment).
  // `cancelled`, when given, is polled while waiting (a caller that went away frees its thread
  // within kCancelPoll, not at the deadline): CANCELLED.
  static constexpr absl::Duration kCancelPoll = absl::Milliseconds(200);
  absl::StatusOr<std::shared_ptr<const CommittedRound>> AwaitUpdate(
      const pb::UpdateRequest& request, absl::Time deadline,
      const std::function<bool()>& cancelled = nullptr);
  // Blocks until `round` has committed (or returns at once if it has), or until `deadline`
  // (DEADLINE_EXCEEDED). Rounds older than the few kept answer FAILED_PRECONDITION.
  absl::StatusOr<std::shared_ptr<const CommittedRound>> AwaitRound(
      uint64_t round, absl::Time deadline, uint32_t fragment = 0,
      const std::function<bool()>& cancelled = nullptr);
  // Streams the current global parameters (fp32) within [offset, offset + n) to `write`, chunk by
  // chunk: each chunk is encoded from the live parameters under the fragment's data lock (no copy
  // of the range is made, a commit waits at most one chunk). A round committed while the range is
  // streamed ends the stream with ABORTED (fetch again); `write` returning false (the caller went
  // away) with CANCELLED.
  absl::Status FetchState(const pb::FetchStateRequest& request,
                          const std::function<bool(pb::StateChunk&&)>& write);

  // Commits the open round if its deadline has passed with enough contributions, and drops
  // members whose lease has run out.
  void Tick(absl::Time now);

  // Durable state, tensor by tensor, so that no whole copy of a fragment is ever made. Snapshot()
  // hands `write` each fragment's tensors in order (parameters, then the optimizer's named state)
  // while that fragment's data is locked (its commits wait; membership and pushes do not), and
  // returns the state's description: rounds, membership epoch, each tensor's size and XXH64, no
  // tensor bytes. Restore() checks a description against this service, reads every tensor through
  // `read` into new memory and checks its hash, then replaces the state: all or nothing, before
  // any island joins. With the durability gate on, a committed round is handed to islands only once
  // MarkDurable() has been called with a description that contains it, so no island ever applies
  // a round that a crash of the service could lose.
  // The tensors of a fragment's state are named: kParamsTensor, then its outer optimizer's
  // (OuterOptimizer::StateTensors: "momentum", "buffer", ...).
  static constexpr const char* kParamsTensor = "params";
  using StateWrite = std::function<absl::Status(uint32_t fragment, const std::string& tensor,
                                                const float* data, size_t n)>;
  // `index`: the fragment's place in the description (a shard's state holds its fragments only).
  using StateRead = std::function<absl::Status(uint32_t index, const std::string& tensor,
                                               float* out, size_t n)>;
  absl::StatusOr<pb::ServiceState> Snapshot(const StateWrite& write) const;
  absl::Status Restore(const pb::ServiceState& description, const StateRead& read);
  void SetDurabilityGate(bool on);
  void MarkDurable(const pb::ServiceState& written);

  // Sharded service. On the coordinator (control plane): a shard server's call. The shard is
  // recorded (its address, its rounds, the islands it heard from, whose leases this renews), and
  // once the membership epoch differs from the one the shard knows, or at `deadline`, the
  // membership is returned. Refused: NOT_FOUND another run, FAILED_PRECONDITION another model
  // config or shard count, INVALID_ARGUMENT a shard index, address or round count out of place.
  // Joins wait (UNAVAILABLE) until every shard has called.
  absl::StatusOr<pb::ShardSyncResponse> ShardSync(const pb::ShardSyncRequest& request,
                                                  absl::Time deadline);
  // On a shard server: what it tells the coordinator (rounds, islands heard from since the last
  // call), and the membership it answered, applied (rounds that waited only for islands that left
  // commit now).
  pb::ShardSyncRequest ShardReport(const std::string& address);
  void MirrorMembership(const pb::ShardSyncResponse& view);
  bool is_control_plane() const {
    return options_.num_shards > 1 && options_.shard == SyncServerOptions::kControlPlane;
  }
  bool is_shard() const { return options_.num_shards > 1 && options_.shard >= 0; }

  // Called (under the server's lock: keep it short) after each commit is published.
  void SetCommitListener(std::function<void(const CommittedRound&)> listener);
  // Tests: called by a commit while it holds its fragment's data lock, before its data work (to
  // hold a commit in progress and see what waits for it).
  void SetCommitHookForTesting(std::function<void(uint32_t fragment)> hook) {
    commit_hook_ = std::move(hook);
  }
  // Called (under the lock) with a line for each membership event worth logging.
  void SetEventListener(std::function<void(const std::string&)> listener);
  size_t num_members() const;
  // Whether `name` is a member or a former member still remembered (an island coming back).
  bool KnowsIsland(const std::string& name) const;

  // What the service knows of the run now (status page, metrics): members with their latest
  // heartbeat and telemetry, former members with their end state.
  struct IslandStatus {
    std::string island_id;
    std::string state;  // membership state name
    uint32_t data_stream = 0;
    uint32_t data_parallel = 1;  // as it declared at join (its claims' bound per step)
    bool member = false;
    bool finished = false;
    double silent_s = 0;     // since the island was last heard of
    uint64_t inner_step = 0;
    pb::IslandTelemetry telemetry;
    uint32_t flagged_claims = 0;  // its contributions that claimed more than its throughput allows
  };
  struct Status {
    std::vector<IslandStatus> islands;  // members, then former members
    std::vector<uint64_t> rounds;       // the open round (version) of each fragment
    uint64_t committed_rounds = 0;
    uint64_t membership_epoch = 0;
    uint64_t lease_expiries = 0;        // members dropped for silence since the service started
  };
  Status GetStatus() const;

  uint64_t round(uint32_t fragment = 0) const;
  uint64_t params_hash(uint32_t fragment = 0) const;
  std::vector<float> params(uint32_t fragment = 0) const;  // a copy (tests, tools)
  uint32_t num_fragments() const { return uint32_t(fragments_.size()); }
  const FragmentLayout& layout(uint32_t fragment = 0) const { return fragments_[fragment].layout; }
  // Rounds (versions in async mode) committed over all fragments.
  uint64_t committed_rounds() const;
  // Async: whether fragment 0's contributions have reached the token budget.
  bool budget_reached() const;
  const SyncServerOptions& options() const { return options_; }

 private:
  friend class PushStream;
  // A verified contribution, kept encoded until its round commits.
  struct Contribution {
    EncodedPayload payload;
    uint64_t tokens = 0;
    double norm = 0;
  };
  // An island's contribution while its ranks' pushes arrive (each carries the ranges it owns).
  struct Partial {
    uint64_t round = 0;  // async: the version it started from
    EncodedPayload payload;
    uint64_t tokens = 0;
    double sum_squares = 0;
  };

  // Locking: `mu_` guards membership, rounds and contributions and is only ever held briefly; a
  // fragment's `data_mu` guards its `data` (parameters, optimizer) and is held through a commit's
  // data work. Lock order: data_mu, then mu_ (never data_mu while holding mu_).
  struct Fragment {
    Fragment(FragmentLayout l, std::vector<float> p, const OuterOptimizerConfig& o);
    FragmentLayout layout;
    std::unique_ptr<std::mutex> data_mu;
    FragmentData data;         // under data_mu
    std::unique_ptr<float[]> accumulator;  // under data_mu: the commits' aggregate, reused
    uint64_t params_hash = 0;  // of `data`'s parameters as published by the last commit
    double params_norm = 0;    // L2, for the relative bound on contributions
    bool committing = false;   // sync: the round's contributions are being committed
    uint64_t round = 0;
    std::map<std::string, Contribution> contributions;  // of `round`, by island id
    std::map<std::string, Partial> partials;            // incomplete ones, by island id
    std::map<std::string, std::pair<uint64_t, pb::PushResponse>> applied;  // async: last, by island
    std::set<std::pair<uint64_t, uint64_t>> known_ranges;  // [begin, end) ranks own
    absl::Time deadline = absl::InfiniteFuture();
    absl::Time opened = absl::InfinitePast();  // the open round's first contribution
    std::deque<std::shared_ptr<const CommittedRound>> committed;  // newest last
    std::map<std::string, uint64_t> last_base;  // async: newest base version pushed, by island
    uint64_t durable_round = 0;                 // rounds of this fragment in a durable snapshot
  };

  absl::Status CheckRun(const std::string& run_id) const;
  absl::StatusOr<std::pair<std::vector<float>, std::unique_ptr<OuterOptimizer>>> ReadFragmentState(
      const pb::FragmentState& state, uint32_t fragment, uint32_t index,
      const StateRead& read) const;
  // A shard server refuses joins, heartbeats and leaves (the coordinator takes them).
  absl::Status CheckMembershipCall() const;
  // A member must present its session; a non-member passes (the caller refuses it its own way).
  absl::Status AuthenticateMemberLocked(const std::string& island, const std::string& session) const;
  // The schedule islands are told at join and by GetState (one source for both).
  void FillSchedule(pb::OuterSchedule* schedule) const;
  // The run's sync schedule (which step each round of each fragment is due after).
  SyncSchedule Schedule() const {
    return SyncSchedule(int(options_.sync_every), int(fragments_.size()), options_.phases);
  }
  absl::StatusOr<uint32_t> CheckFragment(uint32_t fragment) const;
  bool ReadyLocked(const Fragment& f, absl::Time now) const;
  // What a committed round records besides its update.
  struct RoundRecord {
    std::vector<std::string> contributors;
    uint64_t tokens = 0;
    uint64_t staleness = 0;
    std::vector<std::string> dropped;
    AggregationReport aggregation;
    std::map<std::string, double> relative_norms;
  };
  // A sync round taken for commit: its contributions, and what the commit needs from under mu_.
  struct CommitJob {
    uint32_t fragment = 0;
    uint64_t round = 0;
    std::map<std::string, Contribution> contributions;
    double params_norm = 0;
    std::set<std::pair<uint64_t, uint64_t>> known_ranges;
    absl::Time opened;  // the round's first contribution
  };
  // The data a commit produced, published under mu_.
  struct CommitResult {
    std::vector<pb::Chunk> update;
    UpdateRecipe recipe;  // a relayed update: the recipe and its contributions, in its order
    std::vector<std::shared_ptr<const EncodedPayload>> relayed;
    RoundRecord record;
    uint64_t params_hash = 0;
    double params_norm = 0;
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> range_hashes;
    std::vector<std::string> events;
    absl::Time opened = absl::InfinitePast(), started = absl::InfinitePast();  // round, data work
  };
  // Marks every ready round as committing and hands its contributions over; the caller runs the
  // jobs with RunCommits once it has released mu_.
  std::vector<CommitJob> TakeReadyLocked(absl::Time now);
  void RunCommits(std::vector<CommitJob> jobs);
  // Aggregates the round's contributions and applies them (under the fragment's data lock);
  // contributions whose combination would make the parameters non-finite are left out one by one
  // (largest norm first).
  void RunCommit(CommitJob job);
  // The round's contributions as a relayed update would carry them (terms and payloads in the
  // order g was made in).
  struct Relayable {
    std::vector<UpdateTerm> terms;
    std::vector<std::shared_ptr<const EncodedPayload>> payloads;
  };
  // Under the data lock: the update of the outer gradient g, applied (INVALID_ARGUMENT and nothing
  // changed when it would make a parameter non-finite), with the hashes and norm after it. The
  // update is relayed when the step is linear and relaying is smaller (RelayIsSmaller).
  absl::StatusOr<CommitResult> StepLocked(Fragment& f, uint32_t fragment, uint64_t round,
                                          const float* g,
                                          const std::set<std::pair<uint64_t, uint64_t>>& ranges,
                                          Relayable relayable);
  // The hashes and norm of the parameters (under the data lock).
  void MeasureLocked(const Fragment& f, const std::set<std::pair<uint64_t, uint64_t>>& ranges,
                     CommitResult& result);
  // Under mu_: logs the round and releases it to the islands.
  void PublishLocked(uint32_t fragment, CommitResult result, absl::Time now);
  // Sync: the contribution waits for its round (and may complete it: then the caller runs the
  // commit once mu_ is released). Async: it is applied at once, outside mu_.
  absl::StatusOr<pb::PushResponse> RecordLocked(const PayloadId& id, Contribution c,
                                                std::vector<CommitJob>& jobs);
  absl::StatusOr<pb::PushResponse> ApplyAsync(const PayloadId& id, Contribution c,
                                              double steps_per_s);
  // Sync with auto-tune: records the island's figures and tells it the tau to use from now on.
  void TuneLocked(const std::string& island, const IslandFigures& figures,
                  pb::PushResponse& response);
  void StartTuner();
  // An island's data arrived or was read: its lease is renewed as by a heartbeat.
  void Renew(const std::string& island);
  // The cheap checks of a push, at its start and again before it is recorded.
  absl::Status CheckPushLocked(const PayloadId& id) const;
  // Refuses a contribution claiming more tokens than its round allows the island (see
  // SyncServerOptions::tokens_per_step).
  absl::Status CheckClaimLocked(const PayloadId& id, uint64_t tokens) const;
  // The earliest step an island joining now can resume from (Member::resume_floor).
  int64_t ResumeFloorLocked() const;
  // Notes an accepted contribution of `tokens` (the bound on later claims, the flag below).
  void NoteContributedLocked(const PayloadId& id, uint64_t tokens);
  // Flags (counts, and logs at a bounded rate) a member whose claims since it joined exceed
  // kClaimFlagFactor times what its reported throughput could have trained in that time: a claim
  // the round's bound lets through when the island's declared data-parallel ranks are false.
  void FlagClaimLocked(Member& m, absl::Time now);
  // Logs "<key><rest>" unless the key's lines are over their rate (outer/service/log_limiter.h).
  void MemberEventLocked(const std::string& key, const std::string& rest);
  void ClosePush(const PayloadId& id, uint64_t first_offset);
  // Adds a verified stream to the island's contribution; returns the complete contribution when
  // this stream completed it.
  absl::StatusOr<std::optional<Contribution>> AddToPartialLocked(const PayloadId& id,
                                                                 EncodedPayload payload,
                                                                 uint64_t tokens,
                                                                 double sum_squares);
  // Async: a rank whose part did not complete its island's contribution waits for the rank that
  // does, and answers what it was answered.
  absl::StatusOr<pb::PushResponse> AwaitAppliedLocked(std::unique_lock<std::mutex>& lock,
                                                      const PayloadId& id);
  // What the service kept for an island that left or died.
  void ForgetIslandLocked(const std::string& island);
  void RememberRangesLocked(Fragment& f, const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  absl::Status CheckAsyncLocked(const Fragment& f, uint32_t fragment, const std::string& island,
                                uint64_t base) const;
  uint32_t SyncEveryLocked(const std::string& island) const;
  size_t kept_versions() const;
  // Sync: drops a fragment's oldest committed rounds while more than `keep` are kept and their
  // encoded updates (with `extra_bytes` to come) exceed the fragment's budget for them.
  void TrimCommittedLocked(Fragment& f, size_t keep, uint64_t extra_bytes);
  // The run has trained everything it was set up for (islands leaving then is the normal end).
  bool AllDoneLocked() const;

  const SyncServerOptions options_;
  std::unique_ptr<WorkerPool> pool_;  // a commit's data work
  mutable std::mutex mu_;
  std::condition_variable committed_cv_;
  std::vector<Fragment> fragments_;
  Membership membership_;
  // The run's full complement of islands has joined once: the first round stops waiting for
  // latecomers (an island that died before it contributed is not waited for).
  bool complement_reached_ = false;
  uint64_t lease_expiries_ = 0;
  absl::Time complement_deadline_ = absl::InfiniteFuture();  // after a resume: stop waiting then
  std::vector<uint64_t> first_rounds_;  // per fragment: the round the run started or resumed at
  bool durability_gate_ = false;
  std::map<std::string, double> steps_per_s_;  // async: reported inner throughput, by island
  std::unique_ptr<TauTuner> tuner_;            // sync with auto-tune
  std::set<std::tuple<std::string, uint32_t, uint64_t>> open_pushes_;  // (island, fragment, offset)
  uint64_t tokens_committed_ = 0;
  // Control plane: each shard's address (empty until it called). The rounds of the fragments are
  // those the shards last reported.
  std::vector<std::string> shard_addresses_;
  std::condition_variable membership_cv_;  // notified when the membership epoch changes
  std::function<void(const CommittedRound&)> on_commit_;
  std::function<void(const std::string&)> on_event_;
  // Membership events (joins, leaves, deaths) are logged per island at a bounded rate.
  LogLimiter event_limiter_;
  std::function<void(uint32_t)> commit_hook_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SYNC_SERVER_H_
