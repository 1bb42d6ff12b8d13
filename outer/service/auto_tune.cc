#include "outer/service/auto_tune.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace atl::outer {
namespace {

bool Moved(double now, double before) { return std::abs(now - before) > 0.25 * before; }

}  // namespace

absl::Status ValidateFigures(const IslandFigures& f) {
  if (!(f.steps_per_s >= 0) || !std::isfinite(f.steps_per_s) || f.steps_per_s > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner throughput must be a finite number in [0, 1e6] steps/s, got ",
                     f.steps_per_s));
  }
  if (!(f.link_bps >= 0) || !std::isfinite(f.link_bps) || f.link_bps > 1e15) {
    return absl::InvalidArgumentError(
        absl::StrCat("link goodput must be a finite number in [0, 1e15] bit/s, got ", f.link_bps));
  }
  return absl::OkStatus();
}

TauChoice ChooseTau(PlanInput run, double target) {
  run.method = PlanMethod::kStreaming;
  run.steps = 0;
  auto utilization = [&](int tau) {
    run.tau = tau;
    return Simulate(run).utilization;
  };
  TauChoice c;
  c.step_time_s = run.step_time_s;
  c.link_bps = run.link.bandwidth_bps;
  c.predicted_tau0 = utilization(0);
  // Utilization does not fall as tau grows (a later merge never waits longer), so bisect: the
  // service calls this under its lock, and H may be in the thousands. When no tau reaches the
  // target, the smallest as good as the largest.
  const int last = run.sync_every - 1;
  const double goal = std::min(target, utilization(last) - 1e-9);
  int lo = 0, hi = last;  // utilization(hi) >= goal
  if (c.predicted_tau0 >= goal) hi = 0;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (utilization(mid) >= goal ? hi : lo) = mid;
  }
  c.tau = hi;
  c.predicted = utilization(hi);
  return c;
}

TauTuner::TauTuner(PlanInput run, double target, double headroom)
    : run_(std::move(run)), target_(target), headroom_(std::max(1.0, headroom)) {}

std::optional<TauChoice> TauTuner::Report(const std::string& island, const IslandFigures& f) {
  if (!(f.steps_per_s > 0) || !(f.link_bps > 0)) return std::nullopt;
  figures_[island] = f;
  double slowest_steps = f.steps_per_s, slowest_link = f.link_bps;
  for (const auto& [name, g] : figures_) {
    slowest_steps = std::min(slowest_steps, g.steps_per_s);
    slowest_link = std::min(slowest_link, g.link_bps);
  }
  const double step_time_s = 1 / slowest_steps;
  if (choice_ && !Moved(step_time_s, choice_->step_time_s) &&
      !Moved(slowest_link, measured_link_bps_)) {
    return std::nullopt;
  }
  PlanInput run = run_;
  run.step_time_s = step_time_s;
  run.link.bandwidth_bps = slowest_link / headroom_;
  if (!ValidatePlanInput(run).ok()) return std::nullopt;
  const TauChoice previous = choice_.value_or(TauChoice{-1});
  choice_ = ChooseTau(run, target_);
  measured_link_bps_ = slowest_link;
  if (choice_->tau == previous.tau) return std::nullopt;
  return choice_;
}

void TauTuner::Forget(const std::string& island) { figures_.erase(island); }

std::optional<int> TauTuner::tau() const {
  if (!choice_) return std::nullopt;
  return choice_->tau;
}

}  // namespace atl::outer
