#include "inner/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"

namespace atl::inner::parallel {

StageUnits PipelineStageUnits(int n_layer, int stages, int stage) {
  const int base = n_layer / stages, extra = n_layer % stages;
  const int first_block = stage * base + std::min(stage, extra);
  const int blocks = base + (stage < extra ? 1 : 0);
  StageUnits u;
  u.first = stage == 0 ? 0 : 1 + first_block;
  u.last = stage == stages - 1 ? n_layer + 1 : first_block + blocks;
  return u;
}

std::vector<PipelineAction> ScheduleActions(PipelineSchedule schedule, int stage, int stages,
                                            int micro) {
  using A = PipelineAction;
  std::vector<A> out;
  if (schedule == PipelineSchedule::kGPipe) {
    for (int i = 0; i < micro; ++i) out.push_back({A::kForward, i});
    for (int i = 0; i < micro; ++i) out.push_back({A::kBackward, i});
    return out;
  }
  const int warmup = std::min(stages - stage - 1, micro);
  for (int i = 0; i < warmup; ++i) out.push_back({A::kForward, i});
  for (int i = 0; i < micro - warmup; ++i) {
    out.push_back({A::kForward, warmup + i});
    out.push_back({A::kBackward, i});
  }
  for (int i = micro - warmup; i < micro; ++i) out.push_back({A::kBackward, i});
  return out;
}

std::vector<PipelineAction> ForwardActions(int micro) {
  std::vector<PipelineAction> out;
  for (int i = 0; i < micro; ++i) out.push_back({PipelineAction::kForward, i});
  return out;
}

double IdealBubble(int stages, int micro) {
  return double(stages - 1) / double(micro + stages - 1);
}

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Each micro-batch's activation and gradient have their own tag: a pair of stages matches them
// whatever the order of the schedule.
int Tag(const PipelineAction& a) { return 2 * a.micro + (a.kind == PipelineAction::kBackward); }

}  // namespace

absl::StatusOr<PipelineTiming> RunPipeline(Communicator& group,
                                           const std::vector<PipelineAction>& actions,
                                           PipelineStage& stage) {
  const auto start = std::chrono::steady_clock::now();
  const int me = group.rank(), last = group.size() - 1;
  PipelineTiming timing;
  // Sent tensors stay alive (held by their Work) until the end of the run.
  std::vector<std::unique_ptr<Work>> sends;
  auto receive = [&](const PipelineAction& a, int from) -> absl::StatusOr<at::Tensor> {
    at::Tensor t = stage.Boundary(a.micro);
    const auto t0 = std::chrono::steady_clock::now();
    auto s = group.Recv(t, from, Tag(a));
    timing.idle_s += Since(t0);
    if (!s.ok()) return s;
    return t;
  };
  for (const PipelineAction& a : actions) {
    const bool forward = a.kind == PipelineAction::kForward;
    const int from = forward ? me - 1 : me + 1, to = forward ? me + 1 : me - 1;
    at::Tensor in;
    if (from >= 0 && from <= last) {
      ATL_ASSIGN_OR_RETURN(auto got, receive(a, from));
      in = std::move(got);
    }
    ATL_ASSIGN_OR_RETURN(auto out,
                         forward ? stage.Forward(a.micro, in) : stage.Backward(a.micro, in));
    if (to >= 0 && to <= last) {
      if (!out.defined()) {
        return absl::InternalError(absl::StrCat("stage ", me, " has nothing to send for micro-batch ",
                                                a.micro));
      }
      sends.push_back(group.SendAsync(out.contiguous(), to, Tag(a)));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status sent;
  for (auto& w : sends) sent.Update(w->Wait());
  timing.idle_s += Since(t0);
  if (!sent.ok()) return sent;
  timing.total_s = Since(start);
  return timing;
}

}  // namespace atl::inner::parallel
