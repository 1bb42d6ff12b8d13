// The island's two round policies (outer/island/outer_step.h, RoundPolicy): sync rounds on the
// run's schedule, async versions on the island's own H.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/island/outer_step.h"

namespace atl::outer {
namespace {

// Says this island has finished, waits until every other one has too (or the round timeout; a
// restarting coordinator is waited for within it),
// then applies the rounds (versions) committed since, checking every hash: every island ends on
// the run's last global parameters, also when another trained on after it (one that came back
// from a failure trains every step it owes, its rounds after the others'). Rank 0 speaks for the
// island; every rank then catches up with the rounds it heard.
absl::Status FinishWithTheRun(OuterStepHook& hook, bool stopped, double timeout_s) {
  if (stopped) return absl::OkStatus();
  std::string versions;
  if (hook.ranks().rank() == 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    absl::StatusOr<pb::HeartbeatResponse> state;
    while (true) {
      state = hook.session().Heartbeat(/*finished=*/true);
      const bool late = std::chrono::steady_clock::now() > until;
      // A coordinator that is restarting (UNAVAILABLE) is waited for, as long as the others are.
      if (!state.ok() && (!IsTransient(state.status()) || late)) break;
      if (state.ok() && (state->training_members() == 0 || late)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(state.ok() ? 50 : 200));
    }
    versions = state.ok() ? state->SerializeAsString()
                          : std::string("!") + std::string(state.status().message());
  }
  ATL_ASSIGN_OR_RETURN(auto shared, hook.ranks().FromFirst(versions));
  if (!shared.empty() && shared[0] == '!') return absl::UnavailableError(shared.substr(1));
  pb::HeartbeatResponse state;
  if (!state.ParseFromString(shared)) return absl::DataLossError("rank 0's answer is garbled");
  return hook.CatchUp({state.versions().begin(), state.versions().end()});
}

// A run that ends at its tokens (async; sync with outer.run_end = "tokens"): the learning-rate
// schedule follows the run's tokens, not the island's steps. Whether the run's budget is spent.
bool FollowTheRunsTokens(const RunSchedule& schedule, const RoundOutcome& o, IslandModel& model,
                         OuterStepStats& stats) {
  if (schedule.token_budget == 0) return false;
  if (o.tokens_committed > stats.run_tokens) {
    stats.run_tokens = o.tokens_committed;
    model.FollowRunProgress(int64_t(double(stats.run_tokens) / double(schedule.token_budget) *
                                    double(schedule.total_steps)));
  }
  return o.budget_reached || o.tokens_committed >= schedule.token_budget;
}

// Where an island's steps stand on the run's schedule: position(t) = at + (t - from) x rate. An
// island in step has position t. One that was away owes the steps it missed and stands `lag`
// steps ahead of its own step (rate 1). One with dynamic local steps (a run that ends at its
// tokens, outer.run_end) crosses H / H_i positions a step: its rounds have H_i of its steps.
// A move at step t keeps where step t - 1 stood, so that step t crosses the positions after it
// and no position is crossed twice.
class SchedulePosition {
 public:
  int64_t At(int64_t t) const {
    if (t == from_ - 1) return before_;
    return at_ + int64_t(std::floor(double(t - from_) * rate_));
  }
  void MoveTo(int64_t t, int64_t position) {
    before_ = At(t - 1);
    from_ = t;
    at_ = position;
  }
  void MoveBy(int64_t t, int64_t positions) { MoveTo(t, At(t) + positions); }
  void SetRate(int64_t t, double rate) {
    MoveTo(t, At(t));
    rate_ = rate;
  }
  double rate() const { return rate_; }

 private:
  int64_t from_ = 0, at_ = 0, before_ = -1;
  double rate_ = 1;
};

// Rounds: every island pushes fragment p after positions t = t_p (mod H) of the run's schedule and
// the round commits when all have (or at its grace window); the run ends after the run's steps,
// or (outer.run_end = "tokens") once the run's tokens are committed.
//
// An island that was away (down, paused, cut off) owes the steps it missed: it trains every one of
// them (the run takes longer, nothing is skipped). Its pushes follow the run's schedule at its
// position (SchedulePosition), so that each of its rounds has the steps the others' have (a
// restarted island in the warm start does not push one-step rounds into the run's H-step ones)
// and arrives when theirs do; its last push comes after its own last step.
class SyncRounds : public RoundPolicy {
 public:
  SyncRounds(const OuterStepOptions& o, uint32_t fragments)
      : options_(o), schedule_(int(o.schedule.sync_every), int(fragments), o.schedule.phases) {}
  // A run that ends at its tokens: bounded by the whole budget, as async.
  int64_t max_steps() const override {
    return options_.schedule.total_steps *
           (by_tokens() ? int64_t(options_.schedule.num_data_streams) : 1);
  }
  bool IsLast(int64_t t) const override { return finishing_ || t == max_steps(); }
  // The fragments due at the positions step t crossed (one, at rate 1).
  std::vector<uint32_t> DueAfter(int64_t t) const override {
    std::vector<uint32_t> due;
    for (int64_t p = position_.At(t - 1) + 1; p <= position_.At(t); ++p) {
      for (uint32_t f : schedule_.DueAfter(p)) {
        if (std::find(due.begin(), due.end(), f) == due.end()) due.push_back(f);
      }
    }
    std::sort(due.begin(), due.end());
    return due;
  }
  int64_t Delay() const override { return tau_; }
  void SetDelay(int64_t tau) override { tau_ = tau; }
  // In the island's steps: a fragment lands before its next push.
  int64_t DelayAfter(uint32_t f, int64_t t) const override {
    const int64_t p = position_.At(t);
    const double steps = std::ceil(double(schedule_.NextDue(int(f), p) - p) / position_.rate());
    return std::min(tau_, int64_t(steps) - 1);
  }
  bool WarmStartAfter(int64_t t) const override {
    return position_.At(t) <= schedule_.phases().warm_start_steps;
  }
  // The island's own H: the run's, or fewer steps where it trains slower (dynamic local steps).
  uint32_t sync_every() const override {
    return uint32_t(std::max<int64_t>(
        1, std::llround(double(options_.schedule.sync_every) / position_.rate())));
  }
  void Pushed(uint32_t, int64_t) override {}
  int64_t Position(int64_t t) const override { return position_.At(t); }
  // A run that ends at its tokens: the service's H for this island (dynamic local steps, from
  // the throughputs the islands report), once past the warm start and early phases.
  void Landed(const RoundOutcome& o, IslandModel& model, OuterStepStats& stats) override {
    finishing_ |= FollowTheRunsTokens(options_.schedule, o, model, stats);
    const int64_t t = model.step();
    if (by_tokens() && o.sync_every > 0 && position_.At(t) >= schedule_.early_end()) {
      const double rate = double(schedule_.sync_every()) / double(o.sync_every);
      if (rate != position_.rate()) position_.SetRate(t, std::max(1.0, rate));
    }
  }
  // A late push: the island is out of phase with the others, behind by the steps it could have
  // trained since its round committed. Left so, it would be late in every round after (nobody
  // waits for it); it moves its position up by that much (steps it then owes, trained at the
  // end), so that its next push comes when the others' does. Only pushes made since the last move
  // show its phase now. The move is made before the next step's pushes (Advance).
  void FellBehind(int64_t pushed_at, double behind_steps) override {
    if (pushed_at < moved_at_ || !(behind_steps >= 1)) return;
    behind_ = std::max(behind_, behind_steps);
  }
  // Before step t's pushes: a move skips no fragment's due position (those step t crosses
  // included); what does not fit is left (the next late push tells again).
  void Advance(int64_t t) override {
    if (!(behind_ >= 1)) return;
    const double behind = behind_;
    behind_ = 0;
    const int64_t position = position_.At(t), before = position_.At(t - 1);
    int64_t room = INT64_MAX;
    for (int f = 0; f < schedule_.num_fragments(); ++f) {
      room = std::min(room, schedule_.NextDue(f, before) - position - 1);
    }
    const double positions = std::min(behind * position_.rate(), 1e12);
    const int64_t move = std::min<int64_t>(room, std::llround(positions));
    if (move <= 0) return;
    position_.MoveBy(t, move);
    moved_at_ = position + move;
  }
  // Back on the run's rounds, at the start of the open ones (`run`):
  // - a new island (no step of its own, no contribution) joins at the run's step: it owes nothing;
  // - one behind (it was away, or restarted from a checkpoint) keeps its step and owes the rest:
  //   its position moves up to `run`. A restarted island whose checkpoint is older than its last
  //   contribution of fragment 0 the service recorded goes on from that step: none is counted twice;
  // - one whose rounds the service no longer has (it went back to an older state) goes back by as
  //   many steps and trains them again.
  void Rejoined(const RejoinPoint& at, IslandModel& model) override {
    const int64_t run = schedule_.ResumeStep(at.rounds);
    int64_t own = model.step();
    const int64_t done =
        at.done.empty() ? 0 : int64_t(std::min<uint64_t>(at.done[0], uint64_t(max_steps())));
    if (own == 0 && position_.At(0) == 0 && done == 0) {
      model.JumpToStep(run);
      position_.MoveTo(run, run);
      return;
    }
    if (done > own) {
      own = done;
      model.JumpToStep(own);
    }
    const int64_t back = position_.At(own) - run;
    if (at.ahead && back > 0) {
      own = std::max<int64_t>(0, own - back);
      model.JumpToStep(own);
      position_.MoveTo(own, run);
    } else {
      position_.MoveTo(own, std::max(position_.At(own), run));
    }
    moved_at_ = position_.At(own);
  }
  absl::Status Finish(OuterStepHook& hook, bool stopped) override {
    return FinishWithTheRun(hook, stopped, options_.island.round_timeout_s);
  }

 private:
  bool by_tokens() const { return options_.schedule.token_budget > 0; }
  const OuterStepOptions options_;
  const SyncSchedule schedule_;
  int64_t tau_ = options_.island.tau;
  SchedulePosition position_;
  int64_t moved_at_ = 0;    // the position Advance last moved the island to
  double behind_ = 0;       // steps a late push said the island is behind, not yet moved
  bool finishing_ = false;  // a run that ends at its tokens: they are spent
};

// Versions: each contribution is applied as it arrives; the island's H follows its throughput
// (the service's answer), the learning rate the run's progress; the run ends when the token budget
// is spent, and then every island catches up with the versions committed after its last push.
// A warm start (outer.warm_start_steps = W): each of the island's first W steps pushes every
// fragment, merged whole (tau 0, alpha 0), and the service applies it as one island's share of a
// plain average; the fragments' own H then counts from step W.
class AsyncVersions : public RoundPolicy {
 public:
  AsyncVersions(const OuterStepOptions& o, uint32_t fragments)
      : options_(o),
        warm_(o.schedule.phases.warm_start_steps),
        h_now_(o.schedule.sync_every),
        next_due_(fragments) {
    const SyncSchedule schedule(int(o.schedule.sync_every), int(fragments));
    for (uint32_t f = 0; f < fragments; ++f) {
      next_due_[f] = warm_ + (schedule.offset(int(f)) > 0 ? schedule.offset(int(f))
                                                           : o.schedule.sync_every);
    }
  }
  // Bounded by the whole budget.
  int64_t max_steps() const override {
    return options_.schedule.total_steps * int64_t(options_.schedule.num_data_streams);
  }
  bool IsLast(int64_t t) const override { return finishing_ || t == max_steps(); }
  std::vector<uint32_t> DueAfter(int64_t t) const override {
    std::vector<uint32_t> due;
    for (uint32_t f = 0; f < next_due_.size(); ++f) {
      if (WarmStartAfter(t) || next_due_[f] <= t) due.push_back(f);
    }
    return due;
  }
  // A fragment lands before its next push: tau stays below the island's current H.
  int64_t Delay() const override { return std::min<int64_t>(options_.island.tau, h_now_ - 1); }
  int64_t DelayAfter(uint32_t, int64_t t) const override { return WarmStartAfter(t) ? 0 : Delay(); }
  bool WarmStartAfter(int64_t t) const override { return t <= warm_; }
  uint32_t sync_every() const override { return uint32_t(h_now_); }
  void Pushed(uint32_t f, int64_t t) override {
    if (!WarmStartAfter(t)) next_due_[f] = t + h_now_;
  }
  void Landed(const RoundOutcome& o, IslandModel& model, OuterStepStats& stats) override {
    if (o.sync_every > 0) h_now_ = o.sync_every;
    finishing_ |= FollowTheRunsTokens(options_.schedule, o, model, stats);
    stats.staleness.push_back(o.staleness);
  }
  void Rejoined(const RejoinPoint&, IslandModel&) override {}
  absl::Status Finish(OuterStepHook& hook, bool stopped) override {
    return FinishWithTheRun(hook, stopped, options_.island.round_timeout_s);
  }

 private:
  const OuterStepOptions options_;
  const int64_t warm_;              // the warm start's steps
  int64_t h_now_;                   // the island's H (dynamic local steps)
  std::vector<int64_t> next_due_;   // per fragment, the step of its next push
  bool finishing_ = false;          // the run's token budget is spent
};

}  // namespace

std::unique_ptr<RoundPolicy> MakeRoundPolicy(const OuterStepOptions& options, uint32_t fragments) {
  if (options.schedule.async) return std::make_unique<AsyncVersions>(options, fragments);
  return std::make_unique<SyncRounds>(options, fragments);
}

}  // namespace atl::outer
