#include "inner/loop.h"

#include "compression/status_macros.h"

namespace atl::inner {
namespace {

absl::Status Report(StepSource& steps, LoopHooks& hooks) {
  ATL_ASSIGN_OR_RETURN(auto stats, steps.TakeStats());
  if (stats.empty()) return absl::OkStatus();
  return hooks.OnStats(stats);
}

}  // namespace

absl::Status RunLoop(StepSource& steps, int64_t until_step, LoopHooks& hooks) {
  while (steps.step() < until_step) {
    hooks.BeforeStep();
    ATL_RETURN_IF_ERROR(steps.QueueStep());
    int64_t t = steps.step();
    ATL_RETURN_IF_ERROR(hooks.Queued(t));
    if (t >= until_step || hooks.StatsDue(t)) ATL_RETURN_IF_ERROR(Report(steps, hooks));
    ATL_ASSIGN_OR_RETURN(const bool outer_last, hooks.OuterStep(t));
    t = steps.step();  // an outer step may move it (an island rejoining a run)
    const bool last = outer_last || t >= until_step;
    if (hooks.EvalDue(t, last)) ATL_RETURN_IF_ERROR(hooks.Evaluate(t));
    if (hooks.CheckpointDue(t, last)) ATL_RETURN_IF_ERROR(hooks.Checkpoint(t));
    ATL_ASSIGN_OR_RETURN(const bool stop, hooks.Stop(t));
    if (stop || outer_last) break;
  }
  return Report(steps, hooks);
}

}  // namespace atl::inner
