// The outer step of an island, called after every inner step: it pushes the fragments that are
// due (their pseudo-gradients travel in background tasks while training goes on), merges each
// fragment's outer update tau steps later, rejoins when the service dropped the island, and ends
// the run synced. Sync rounds and async versions are two policies, chosen once.
//
// It sees the model only through IslandModel (flat fp32 vectors per fragment: src/ implements it
// over the trainer), the service only through a Transport and the IslandSession.
//
// Threading: everything runs on the training thread except the push-and-wait tasks, which own
// their snapshot of the parameters and their fragment's IslandSync until they are landed.
#ifndef ATOLL_OUTER_ISLAND_OUTER_STEP_H_
#define ATOLL_OUTER_ISLAND_OUTER_STEP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/island/eager_update.h"
#include "outer/base/fragments.h"
#include "outer/island/island_session.h"
#include "outer/island/island_sync.h"
#include "outer/base/outer_config.h"

namespace atl::outer {

// What the outer step needs of the inner training.
class IslandModel {
 public:
  virtual ~IslandModel() = default;
  virtual int64_t step() const = 0;
  // The local values of a fragment's parameters, flat, in the service's order.
  virtual std::vector<float> Snapshot(uint32_t fragment) = 0;
  // theta = alpha * theta + (1 - alpha) * global (alpha 0: load the global parameters). A model
  // with a device copy of the fragment merges from that copy, equal to `global`.
  virtual void Merge(uint32_t fragment, const std::vector<float>& global, double alpha) = 0;
  // The copy of fragment f's global parameters the model keeps on its device (outer/island/device_copy.h),
  // or nullptr: its pseudo-gradients are then made on the host from Snapshot.
  virtual DeviceCopy* device_copy(uint32_t) { return nullptr; }
  // Sync: back in step with the run after a rejoin (the service may have lost rounds).
  virtual void JumpToStep(int64_t step) = 0;
  // Async: the learning-rate schedule follows the run's progress, not this island's steps.
  virtual void FollowRunProgress(int64_t position) = 0;
  // The tokens the island trained in steps (from, to]: by default the steps times the island's
  // fixed tokens per step (OuterStepOptions); a model whose steps differ (a Python loop's
  // batches) counts its own.
  virtual std::optional<uint64_t> TokensBetween(int64_t /*from*/, int64_t /*to*/) const {
    return std::nullopt;
  }
  // Moments (outer.moment_sync_every): the inner optimizer's name ("adamw", "muon"), or "" when
  // this model's moments cannot be averaged (then the island keeps its own); its moments of
  // fragment f's owned ranges, channel-major as the moment layout says (kMomentChannels x the
  // owned elements); their replacement by an average; and whether the optimizer has taken no
  // step yet (a joiner without a checkpoint, which starts from the run's newest average).
  virtual std::string moment_optimizer() const { return ""; }
  virtual std::vector<float> MomentSnapshot(uint32_t /*fragment*/) { return {}; }
  virtual void LoadMoments(uint32_t /*fragment*/, const std::vector<float>& /*moments*/) {}
  virtual bool MomentsFresh() const { return false; }
};

// What a rank carries of a fragment: the ranges [begin, end) of its `elements` it owns (empty: the
// whole fragment), or nothing (`carried` false: a replica of ranks that carry it, or a pipeline
// stage that holds none of it; the first rank that carries it speaks for the island about it).
struct FragmentShare {
  uint64_t elements = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  bool carried = true;
};

// What the service decides for every island of the run: the schedule it announces at join
// (JoinResponse.schedule) and by GetState. An island never chooses these.
struct RunSchedule {
  int64_t total_steps = 0;        // the run's inner steps (async: each island's share of the budget)
  uint32_t sync_every = 0;        // H
  SyncPhases phases;              // sync: warm start and early H before H
  bool async = false;
  uint64_t token_budget = 0;      // async: the run's tokens
  uint32_t num_data_streams = 1;
  uint32_t moment_sync_every = 0;  // sync: rounds between moment averages (0: none)
};

// The schedule a service announced.
RunSchedule ScheduleOf(const pb::OuterSchedule& schedule);
// Its phases alone.
SyncPhases PhasesOf(const pb::OuterSchedule& schedule);
// An island configured for one mode (outer.mode) refuses a run of the other.
absl::Status CheckRunMode(const OuterConfig& outer, const pb::OuterSchedule& schedule);

// What each island chooses for itself, from its own [outer] section.
struct IslandChoices {
  int tau = 0;                    // inner steps between a fragment's push and its merge
  double alpha = 0;               // merge factor
  // Eager updates (outer/island/eager_update.h; outer.eager_updates): the outer step per unit of the
  // averaged pseudo-gradient (EagerGain); 0: off (rounds in flight land with the alpha merge).
  double eager_gain = 0;
  bool auto_tune = false;         // sync: tau follows the service's choice (outer/service/auto_tune.h)
  double round_timeout_s = 600;   // async: how long an island waits for the others to finish
  RetryPolicy retry;
  IslandSyncOptions sync;         // codec, error feedback, rounding (fragment set per fragment)
};

// The island's choices from its [outer] section; `rounding_seed` (stochastic rounding) should
// differ between islands.
IslandChoices IslandChoicesOf(const OuterConfig& outer, uint64_t rounding_seed);

struct OuterStepOptions {
  RunSchedule schedule;          // the service's
  IslandChoices island;          // this island's
  int64_t tokens_per_step = 0;   // of this island (all its data-parallel ranks)
};

// A fragment's round, merged.
struct LandedRound {
  uint32_t fragment = 0;
  int64_t pushed_at = 0;  // inner step of the snapshot
  int64_t step = 0;       // inner step after which it was merged
  int64_t tau = 0;        // inner steps between its push and its merge (as scheduled)
  double idle_s = 0;      // the training thread waited this long for it
  uint32_t sync_every = 0;  // the island's H from now on
  uint64_t global_hash = 0;  // of the fragment's global parameters (this rank's) after the merge
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> range_hashes;  // begin, end, ParamsHash
  RoundOutcome outcome;
};

struct OuterStepStats {
  uint64_t rounds = 0, resyncs = 0, rejoins = 0;
  uint64_t late_pushes = 0;  // sync: contributions folded into a later round (outer.max_staleness)
  uint64_t caught_up_rounds = 0;  // rounds (versions) applied after the island's last step
  double idle_s = 0;  // the training thread waiting for outer updates
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t elements_synced = 0;  // parameters carried, summed over rounds (bits per parameter)
  uint64_t peak_bytes_in_flight = 0;
  std::vector<uint32_t> staleness;  // async: of each contribution, in order
  uint64_t run_tokens = 0;          // async: the run's tokens as of the last answer
  double link_bps = 0;              // goodput of the last full-state fetch (join, resync)
  int seeded_fragments = 0;         // taken from the island's own parameters (hash-checked)
  int64_t tau = 0;                  // inner steps between a push and its merge, now
  uint64_t moment_rounds = 0;       // averaged moments loaded (outer.moment_sync_every)
  int joined_with_moments = 0;      // fragments a joiner took the run's averaged moments of
};

// An island's training as its heartbeats report it.
struct TrainingFigures {
  double loss = 0;
  std::optional<double> val_loss, val_bpb;  // of its last evaluation
  double tokens_per_s = 0;
  double utilization = 0;       // compute time over wall time
  uint64_t tokens = 0;          // at the island's step
  uint64_t tokens_trained = 0;  // by this process (its restarts' recomputed steps included)
  uint64_t stuck_reloads = 0;   // OuterStepHook::ReloadGlobal's
};

// The heartbeats' telemetry: the figures, each clamped to what the service accepts
// (outer/service/sync_types.h), this process's id (the service's account of where the run's
// tokens went: outer/service/token_ledger.h) and the outer step's bytes.
pb::IslandTelemetry TelemetryOf(const TrainingFigures& figures, const OuterStepStats& stats);

class OuterStepHook;

// Where a joining or rejoining island stands against the run.
struct RejoinPoint {
  std::vector<uint64_t> rounds;  // each fragment's open round, as the island now holds it
  // The newest inner step of the island's contributions to each fragment the service recorded (a
  // restarted island's checkpoint may be older; 0: none).
  std::vector<uint64_t> done;
  bool ahead = false;  // the island held rounds the service no longer has (it went back)
};

// When fragments are pushed and when the island is done: sync rounds (the run's schedule, every
// island in step) or async versions (each island's own H, until the run's token budget is spent).
class RoundPolicy {
 public:
  virtual ~RoundPolicy() = default;
  virtual int64_t max_steps() const = 0;
  virtual bool IsLast(int64_t t) const = 0;
  virtual std::vector<uint32_t> DueAfter(int64_t t) const = 0;
  virtual int64_t Delay() const = 0;  // inner steps between a push and its merge
  virtual void SetDelay(int64_t) {}   // sync with auto-tune: the service's choice
  // The delay of fragment f's push after step t: Delay(), shortened where the fragment's next
  // push comes sooner (the early phases of a sync schedule).
  virtual int64_t DelayAfter(uint32_t, int64_t) const { return Delay(); }
  // Whether the round pushed after step t is a warm-start round (a plain average, merged whole).
  virtual bool WarmStartAfter(int64_t) const { return false; }
  virtual uint32_t sync_every() const = 0;
  virtual void Pushed(uint32_t fragment, int64_t t) = 0;
  // Where step t stands on the run's schedule (sync: the island's step plus the steps it owes).
  virtual int64_t Position(int64_t t) const { return t; }
  // Sync: a push made at schedule position `pushed_at` came `behind_steps` of the island's steps
  // after its round committed (a late push).
  virtual void FellBehind(int64_t /*pushed_at*/, double /*behind_steps*/) {}
  // Before step t's pushes (after what was due landed): the island may move on the schedule.
  virtual void Advance(int64_t /*t*/) {}
  // A merged round's answer; may move the model's schedule.
  virtual void Landed(const RoundOutcome& outcome, IslandModel& model, OuterStepStats& stats) = 0;
  // After a (re)join, with the global parameters of each fragment's open round loaded: where the
  // island goes on from (outer/island/round_policy.cc says how).
  virtual void Rejoined(const RejoinPoint& at, IslandModel& model) = 0;
  // The end of the run, once the island's last contribution has landed.
  virtual absl::Status Finish(OuterStepHook& hook, bool stopped) = 0;
};

// Sync rounds or async versions, as the run's schedule says (outer/island/round_policy.cc).
std::unique_ptr<RoundPolicy> MakeRoundPolicy(const OuterStepOptions& options, uint32_t fragments);

class OuterStepHook {
 public:
  // Every rank of an island runs one, over the ranges it owns; `ranks` shares the decisions.
  OuterStepHook(Transport& transport, IslandSession& session, IslandRanks& ranks,
                IslandModel& model, std::vector<FragmentShare> fragments, OuterStepOptions options);
  ~OuterStepHook();

  // Loads the global parameters into the model and puts the island on the run's schedule (a
  // join: a new island at the run's step, a restarted one at its own), waiting for a restarting
  // service.
  absl::Status FetchGlobal();
  // After an inner step: lands what is due, rejoins if the service dropped the island, pushes
  // what is due. `steps_per_s`: the island's measured inner throughput (async DyLU).
  absl::Status AfterStep(double steps_per_s);
  // Whether AfterStep at step t pushes local progress (a fragment due, or the run's end): what
  // the island has trained must be judged (the loss-spike guard) before.
  bool PushesAfter(int64_t t) const;
  // The island has done its last step (sync: the run's last; async: the budget is spent).
  bool done() const { return done_; }
  // Async islands train until the budget is spent, bounded by the whole budget.
  int64_t max_steps() const;
  // Ends the run: lands what is in flight; then every island waits for the others and applies the
  // rounds (versions) committed since, so that it ends on the service's final parameters. A
  // stopped island (SIGTERM) instead pushes what it trained since its last push of each fragment
  // (sync), so that its last steps count, and does not wait.
  absl::Status Finish(bool stopped);
  // Drops the local progress since the last sync (the loss-spike guard): what is in flight lands
  // first (waiting for it), then every fragment goes back to its global parameters.
  absl::Status ReloadGlobal();
  // Reloads (ReloadGlobal) of global parameters already reloaded once, no commit between.
  uint64_t stuck_reloads() const { return stuck_reloads_; }

  void set_observer(std::function<void(const LandedRound&)> observer) {
    observer_ = std::move(observer);
  }
  std::function<void(const std::string&)> on_message;  // lines worth printing
  const OuterStepStats& stats() const { return stats_; }
  // "H = 50, 2 fragment(s), tau = 2, alpha = 0.50, fp4_e2m1": the island's outer settings.
  std::string Describe() const;
  uint64_t fetched_bytes() const;
  // ParamsHash of the global parameters this rank holds, fragments concatenated (with one
  // fragment: the service's hash of it).
  uint64_t global_hash() const;
  std::vector<uint64_t> fragment_hashes() const;  // each fragment's global copy (this rank's part)
  // The ranges of fragment f this rank holds and their hashes (for the round records).
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> RangeHashes(uint32_t f) const;
  uint64_t round() const { return syncs_[0]->round(); }
  // The open round of each fragment, as the island holds them.
  std::vector<uint64_t> Rounds() const;
  IslandSession& session() { return session_; }
  IslandRanks& ranks() { return ranks_; }

  // This rank's error-feedback residuals (host path) for checkpoints: per fragment, its owned
  // ranges and their values concatenated, as of each fragment's last accepted push. Any thread.
  struct Residual {
    uint32_t fragment = 0;
    uint64_t fragment_elements = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    std::vector<float> values;
  };
  std::vector<Residual> Residuals() const;
  // A resumed island, before its first push: takes what this rank owns from residuals any ranks
  // wrote (their ranges need not be this rank's); elements none covers start at zero.
  absl::Status RestoreResiduals(const std::vector<Residual>& from);

  // Async: applies the versions committed up to `versions` (one per fragment), then loads them.
  absl::Status CatchUp(const std::vector<uint64_t>& versions);

 private:
  struct InFlight {
    uint32_t fragment = 0;
    int64_t pushed_at = 0, apply_at = 0;
    int64_t since = 0;     // the fragment's push before it: the steps this one carries began there
    int64_t position = 0;  // the schedule's position at the push (RoundPolicy::Position)
    uint64_t bytes = 0;  // encoded payload, counted while in flight
    bool averaging = false;  // a warm-start round: merged with alpha 0
    bool eager = false;      // the island trains on eager_[fragment]'s stand-in until it lands
    // What was pushed (host path), kept to push it again if the island was dropped or lost the
    // service meanwhile (outer/island/rejoin.cc).
    std::shared_ptr<const std::vector<float>> local;
    uint64_t tokens = 0;
    double steps_per_s = 0;
    std::future<absl::StatusOr<RoundOutcome>> result;
  };
  // Pushes that did not reach the service (dropped island, lost connection), kept for the rejoin.
  std::vector<InFlight> refused_;
  void Push(uint32_t fragment, int64_t t, int64_t apply_at, double steps_per_s);
  // The tokens of fragment f's next push: those of the steps since its last push.
  uint64_t TokensSincePush(uint32_t f, int64_t t) const;
  // Waits for the oldest round in flight and merges it: keep_local, with the island's progress
  // since the push (the alpha merge, or eager updates); else the island takes the global
  // parameters (a rejoin, the run's end, a reload).
  absl::Status Land(bool keep_local);
  // Waits for the oldest round in flight to end (Land's wait); interruptible.
  absl::Status AwaitOldest();
  // A push refused because its round went on without it: the island keeps the steps it carried
  // and trained since, on the new global parameters, and its next push of the fragment carries
  // them and claims their tokens. False where it cannot (the island then takes the global ones).
  bool CarryRefused(const InFlight& job, const RoundOutcome& outcome);
  // Everything in flight: onto the global parameters, or (keep_local) merged as when it is due.
  absl::Status LandAll(bool keep_local = false);
  absl::Status LandDue(int64_t t);      // what is due after step t, keeping local progress
  // The global parameters into the model, every rank at the same rounds.
  absl::Status LoadGlobal();
  RejoinPoint Where(bool ahead) const;

  // ---- rejoins and leaving (outer/island/rejoin.cc)
  // After the service dropped the island (or restarted): joins again and goes on without losing
  // what it trained (KeepProgress), or, where it cannot, from the global state.
  absl::Status Rejoin(const absl::Status& why);
  // Whether every rank can keep its progress through this rejoin: sync, host copies, no eager
  // stand-ins, no fragment ahead of the service's rounds `service`, the same refused pushes.
  absl::StatusOr<bool> CanKeepProgress(const std::vector<uint64_t>& service);
  // Each fragment: a refused push is pushed again (on time into its still open round, or late),
  // the global copy catches up with the service's round, and the island's progress since its
  // last push is carried onto it: its next push brings those steps, with their tokens.
  absl::Status KeepProgress(const std::vector<uint64_t>& service);
  // The fallback: refused pushes pushed again (late), then the global state is loaded.
  void PushRefusedAgain();
  // SIGTERM: what each fragment trained since its last push, pushed without waiting.
  absl::Status LeaveWithProgress();
  // After each rank's fetch: every rank of the island at the same round of fragment f.
  absl::Status AgreeOnRound(uint32_t f);
  // Every rank adopts the answer of the first rank that carries fragment f; `behind_steps`: how
  // many steps late its push was (0: on time).
  absl::Status FollowFirstCarrier(uint32_t f, absl::StatusOr<RoundOutcome>& outcome,
                                  int64_t& behind_steps);
  absl::Status AdoptTau(int tau);

  Transport& transport_;
  IslandSession& session_;
  IslandRanks& ranks_;
  IslandModel& model_;
  const OuterStepOptions options_;
  std::unique_ptr<RoundPolicy> policy_;
  std::vector<std::unique_ptr<IslandSync>> syncs_;
  std::deque<InFlight> in_flight_;
  std::vector<EagerUpdate> eager_;  // per fragment, with eager updates (sync rounds)
  uint64_t bytes_in_flight_ = 0;
  std::vector<int64_t> last_push_;  // per fragment: step of its last push (or spike reload)
  std::vector<uint64_t> reloaded_hashes_;  // the fragments' global hashes at the last reload
  uint64_t stuck_reloads_ = 0;
  double steps_per_s_ = 0;          // the island's inner throughput, as AfterStep was told
  bool done_ = false;
  std::optional<absl::Status> pending_rejoin_;
  OuterStepStats stats_;
  std::function<void(const LandedRound&)> observer_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_OUTER_STEP_H_
