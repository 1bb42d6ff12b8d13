// Pipeline parallelism inside an island: the model's units (embeddings, blocks, final norm with
// the head) split into contiguous stages over the mesh's pp dimension; a step's micro-batches flow
// through them, activations forward and their gradients backward by point-to-point send/recv of
// the pp group.
//
// Balancing rule: the blocks are split into runs whose sizes differ by at most one, the longer
// runs first; the embeddings (a lookup) go with the first stage, the final norm, the head and the
// loss with the last (which is why the spare blocks go to the first stages).
//
// Schedules, for p stages and m micro-batches (F: forward, B: backward of a micro-batch):
//   GPipe: every forward, then every backward: holds the activations of all m micro-batches.
//   1F1B:  stage s runs min(p - s - 1, m) forwards, then alternates one forward and one backward,
//          then the backwards left: holds at most p - s micro-batches' activations.
// Both idle each stage for (p - 1) / (m + p - 1) of the step in theory (the bubble); RunPipeline
// measures it (the time each stage waits for its peers).
//
// Sends are asynchronous and waited for at the end of the run; receives block (with the group's
// timeout). Nothing here knows of FSDP or the model: a stage is anything that implements
// PipelineStage.
#ifndef ATOLL_INNER_PARALLEL_PIPELINE_H_
#define ATOLL_INNER_PARALLEL_PIPELINE_H_

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/parallel/communicator.h"
#include "inner/parallel/parallelism_config.h"  // PipelineSchedule

namespace atl::inner::parallel {


// The units [first, last] of stage `stage` of `stages` for a model of `n_layer` blocks (unit 0:
// embeddings, 1..n_layer: blocks, n_layer + 1: the final norm and the head).
struct StageUnits {
  int first = 0, last = 0;
};
StageUnits PipelineStageUnits(int n_layer, int stages, int stage);

struct PipelineAction {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int micro = 0;
  bool operator==(const PipelineAction& o) const { return kind == o.kind && micro == o.micro; }
};
// What stage `stage` of `stages` runs, in order, for `micro` micro-batches.
std::vector<PipelineAction> ScheduleActions(PipelineSchedule schedule, int stage, int stages,
                                            int micro);
// The forwards of `micro` micro-batches, nothing else (evaluation).
std::vector<PipelineAction> ForwardActions(int micro);
// (p - 1) / (m + p - 1): the fraction of a step each stage idles, in theory.
double IdealBubble(int stages, int micro);

// A stage of the pipeline: the part of the model one rank of the pp group runs.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Micro-batch `micro` forward: `input` is what the stage before sent (undefined on the first
  // stage). Returns what goes to the next stage (ignored on the last stage).
  virtual absl::StatusOr<at::Tensor> Forward(int micro, const at::Tensor& input) = 0;
  // Its backward: `grad` is the gradient of the forward's output that the next stage sent
  // (undefined on the last stage). Returns the gradient of the forward's input (ignored on the
  // first stage).
  virtual absl::StatusOr<at::Tensor> Backward(int micro, const at::Tensor& grad) = 0;
  // An uninitialized tensor of the shape of what crosses stages for `micro` (activations and
  // their gradients have the same).
  virtual at::Tensor Boundary(int micro) = 0;
};

struct PipelineTiming {
  double total_s = 0;  // the run, send waits included
  double idle_s = 0;   // waiting for the other stages (receives, and the sends at the end)
  double bubble() const { return total_s > 0 ? idle_s / total_s : 0; }
};

// Runs `actions` on this rank's stage, exchanging with the neighbouring ranks of `group` (the pp
// group: rank = stage). Every stage must run the same schedule. One stage: no exchange.
absl::StatusOr<PipelineTiming> RunPipeline(Communicator& group,
                                           const std::vector<PipelineAction>& actions,
                                           PipelineStage& stage);

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_PIPELINE_H_
