// The parts of the training loop (inner/loop.h) that every loop shares, each owning its cadence
// and its state: evaluations, checkpoints, the loss-spike guard, the stop signal. What they do is
// the caller's (a function each); when is theirs. Torch-free.
#ifndef ATOLL_INNER_LOOP_PARTS_H_
#define ATOLL_INNER_LOOP_PARTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/loop.h"
#include "inner/loss_guard.h"

namespace atl::inner {

// When a periodic part acts: every `every` steps (0: never), except at the run's final step,
// where it acts only `at_end`. The final step is the loop's last, or `final_step` when set (`atoll
// train`: train.steps, even when the loop stops before it).
struct Cadence {
  int64_t every = 0;
  bool at_end = false;
  int64_t final_step = -1;

  bool Final(int64_t step, bool last) const { return final_step >= 0 ? step == final_step : last; }
  bool Due(int64_t step, bool last) const {
    const bool final = Final(step, last);
    return (every > 0 && step % every == 0 && !final) || (final && at_end);
  }
};

// Does `act(step)` on its cadence, after the step (and its outer step); the steps' stats come
// over first, so that reports and the spike guard have judged every step it follows.
class PeriodicPart : public LoopPart {
 public:
  PeriodicPart(Cadence cadence, std::function<absl::Status(int64_t step)> act)
      : cadence_(cadence), act_(std::move(act)) {}
  bool StatsDue(int64_t step) const override { return Due(step, false); }
  absl::Status AfterStep(int64_t step, bool last) override {
    return Due(step, last) ? act_(step) : absl::OkStatus();
  }
  bool Due(int64_t step, bool last) const { return cadence_.Due(step, last); }

 private:
  Cadence cadence_;
  std::function<absl::Status(int64_t)> act_;
};

// Evaluations (train.eval_every) and checkpoints (train.checkpoint_every).
using Evaluation = PeriodicPart;
using Checkpoints = PeriodicPart;

// The loss-spike guard (inner/loss_guard.h) over every step's loss, in order: the first spike of
// a report is handed to `on_spike` with its step, the guard's reason, and whether every loss of the
// report was finite (the steps after a spike went on from its parameters; theirs stay unjudged).
class SpikeCheck : public LoopPart {
 public:
  using OnSpike = std::function<absl::Status(int64_t step, const std::string& why, bool finite)>;
  SpikeCheck(int window, double factor, OnSpike on_spike)
      : guard_(window, factor), on_spike_(std::move(on_spike)) {}
  absl::Status OnStats(const std::vector<StepStats>& steps) override;

 private:
  LossSpikeGuard guard_;
  OnSpike on_spike_;
};

// Ends the loop after the step at which `requested` says so (an island's ranks decide together).
class StopSignal : public LoopPart {
 public:
  explicit StopSignal(std::function<absl::StatusOr<bool>()> requested)
      : requested_(std::move(requested)) {}
  absl::StatusOr<bool> Stop(int64_t) override;
  bool stopped() const { return stopped_; }

 private:
  std::function<absl::StatusOr<bool>()> requested_;
  bool stopped_ = false;
};

}  // namespace atl::inner

#endif  // ATOLL_INNER_LOOP_PARTS_H_
