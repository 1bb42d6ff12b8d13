#include "inner/loop.h"

#include "compression/status_macros.h"

namespace atl::inner {
namespace {

absl::Status Report(StepSource& steps, const std::vector<LoopPart*>& parts) {
  ATL_ASSIGN_OR_RETURN(auto stats, steps.TakeStats());
  if (stats.empty()) return absl::OkStatus();
  for (LoopPart* p : parts) ATL_RETURN_IF_ERROR(p->OnStats(stats));
  return absl::OkStatus();
}

bool StatsDue(const std::vector<LoopPart*>& parts, int64_t t) {
  for (const LoopPart* p : parts) {
    if (p->StatsDue(t)) return true;
  }
  return false;
}

}  // namespace

absl::Status RunLoop(StepSource& steps, int64_t until_step, const std::vector<LoopPart*>& parts) {
  while (steps.step() < until_step) {
    for (LoopPart* p : parts) p->BeforeStep();
    ATL_RETURN_IF_ERROR(steps.QueueStep());
    int64_t t = steps.step();
    for (LoopPart* p : parts) ATL_RETURN_IF_ERROR(p->Queued(t));
    if (t >= until_step || StatsDue(parts, t)) ATL_RETURN_IF_ERROR(Report(steps, parts));
    bool outer_last = false;
    for (LoopPart* p : parts) {
      ATL_ASSIGN_OR_RETURN(const bool done, p->OuterStep(t));
      outer_last = outer_last || done;
    }
    t = steps.step();  // an outer step may move it (an island rejoining a run)
    const bool last = outer_last || t >= until_step;
    for (LoopPart* p : parts) ATL_RETURN_IF_ERROR(p->AfterStep(t, last));
    bool stop = false;
    for (LoopPart* p : parts) {  // every part is asked: a stop may be a collective decision
      ATL_ASSIGN_OR_RETURN(const bool s, p->Stop(t));
      stop = stop || s;
    }
    if (stop || outer_last) break;
  }
  return Report(steps, parts);
}

}  // namespace atl::inner
