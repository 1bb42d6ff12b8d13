// The island's two round policies (outer/island/outer_step.h, RoundPolicy): sync rounds on the
// run's schedule, async versions on the island's own H.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/island/outer_step.h"

namespace atl::outer {
namespace {

// Says this island has finished, waits until every other one has too (or the round timeout),
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
      if (!state.ok()) break;
      if (state->training_members() == 0 || std::chrono::steady_clock::now() > until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
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

// Rounds: every island pushes fragment p after steps t = t_p (mod H) of the run's schedule and the
// round commits when all have; the run ends after the run's steps.
//
// An island that was away (down, paused, cut off) owes the steps it missed: it trains every one of
// them (the run takes longer, nothing is skipped), `lag_` steps behind the others. Its pushes
// follow the run's schedule at its position, its own step + lag_, so that each of its rounds has
// the steps the others' have (a restarted island in the warm start does not push one-step rounds
// into the run's H-step ones) and arrives when theirs do; its last push comes after its own last
// step.
class SyncRounds : public RoundPolicy {
 public:
  SyncRounds(const OuterStepOptions& o, uint32_t fragments)
      : options_(o), schedule_(int(o.schedule.sync_every), int(fragments), o.schedule.phases) {}
  int64_t max_steps() const override { return options_.schedule.total_steps; }
  bool IsLast(int64_t t) const override { return t == options_.schedule.total_steps; }
  std::vector<uint32_t> DueAfter(int64_t t) const override { return schedule_.DueAfter(t + lag_); }
  int64_t Delay() const override { return tau_; }
  void SetDelay(int64_t tau) override { tau_ = tau; }
  int64_t DelayAfter(uint32_t f, int64_t t) const override {
    return std::min(tau_, schedule_.NextDue(int(f), t + lag_) - (t + lag_) - 1);
  }
  bool WarmStartAfter(int64_t t) const override {
    return t + lag_ <= schedule_.phases().warm_start_steps;
  }
  uint32_t sync_every() const override { return options_.schedule.sync_every; }
  void Pushed(uint32_t, int64_t) override {}
  void Landed(const RoundOutcome&, IslandModel&, OuterStepStats&) override {}
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
    if (own == 0 && lag_ == 0 && done == 0) {
      model.JumpToStep(run);
      return;
    }
    if (done > own) {
      own = done;
      model.JumpToStep(own);
    }
    const int64_t back = own + lag_ - run;
    if (at.ahead && back > 0) {
      own = std::max<int64_t>(0, own - back);
      model.JumpToStep(own);
    }
    lag_ = std::max<int64_t>(at.ahead ? 0 : lag_, run - own);
  }
  absl::Status Finish(OuterStepHook& hook, bool stopped) override {
    return FinishWithTheRun(hook, stopped, options_.island.round_timeout_s);
  }

 private:
  const OuterStepOptions options_;
  const SyncSchedule schedule_;
  int64_t tau_ = options_.island.tau;
  int64_t lag_ = 0;  // steps behind the run's schedule (an island that was away)
};

// Versions: each contribution is applied as it arrives; the island's H follows its throughput
// (the service's answer), the learning rate the run's progress; the run ends when the token budget
// is spent, and then every island catches up with the versions committed after its last push.
class AsyncVersions : public RoundPolicy {
 public:
  AsyncVersions(const OuterStepOptions& o, uint32_t fragments)
      : options_(o), h_now_(o.schedule.sync_every), next_due_(fragments) {
    const SyncSchedule schedule(int(o.schedule.sync_every), int(fragments));
    for (uint32_t f = 0; f < fragments; ++f) {
      next_due_[f] = schedule.offset(int(f)) > 0 ? schedule.offset(int(f)) : o.schedule.sync_every;
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
      if (next_due_[f] <= t) due.push_back(f);
    }
    return due;
  }
  // A fragment lands before its next push: tau stays below the island's current H.
  int64_t Delay() const override { return std::min<int64_t>(options_.island.tau, h_now_ - 1); }
  uint32_t sync_every() const override { return uint32_t(h_now_); }
  void Pushed(uint32_t f, int64_t t) override { next_due_[f] = t + h_now_; }
  void Landed(const RoundOutcome& o, IslandModel& model, OuterStepStats& stats) override {
    if (o.sync_every > 0) h_now_ = o.sync_every;
    finishing_ |= o.budget_reached;
    if (o.tokens_committed > stats.run_tokens && options_.schedule.token_budget > 0) {
      stats.run_tokens = o.tokens_committed;
      model.FollowRunProgress(int64_t(double(stats.run_tokens) / double(options_.schedule.token_budget) *
                                      double(options_.schedule.total_steps)));
    }
    stats.staleness.push_back(o.staleness);
  }
  void Rejoined(const RejoinPoint&, IslandModel&) override {}
  absl::Status Finish(OuterStepHook& hook, bool stopped) override {
    return FinishWithTheRun(hook, stopped, options_.island.round_timeout_s);
  }

 private:
  const OuterStepOptions options_;
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
