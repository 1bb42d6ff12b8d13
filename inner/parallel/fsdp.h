// A model of any family (inner/model/causal_lm.h) trained unit by unit (the embeddings, each block,
// the final norm with the head: its plan says which parameters are which), each
// unit's parameters kept as one flat fp32 buffer sharded over the mesh's dp_shard ranks (FSDP,
// ZeRO-3): a rank holds its shard of every unit's parameters, gradients and AdamW state, and the
// whole of one unit (two with prefetch) only while it computes with it.
//
//   forward, unit u:   all-gather u's parameters (u + 1's starts in the background meanwhile),
//                      run it, free them (the autograd graph keeps the storage object, empty)
//   backward, unit u:  gather u again (u - 1 prefetched), backward through u (recomputing its
//                      forward first with activation checkpointing), reduce-scatter its gradients
//                      into the shard, free the full parameters and gradients
//
// One rank is the case N = 1 of the same code: the shard is the whole unit, nothing is gathered or
// freed, gradients accumulate in place. Gradients are summed over dp_replicate after the last
// micro-batch (HSDP). Each unit's flat buffer is padded to a multiple of the shard count.
//
// With tensor parallelism (mesh tp > 1) the plan's tensor parallelism is applied to the module
// (inner/parallel/tensor_parallel.h): it is this rank's TP part of the model and the units hold
// those parts: the parameters every TP rank holds whole come
// first in each unit, so that their shards sit at the same place on every TP rank. TP rank 0 owns
// them; on the other TP ranks their shards are replicas (training keeps them equal by itself,
// their gradients being equal; BroadcastShards after the outer sync wrote rank 0's). With sequence
// parallelism those of the blocks (LayerNorms, row-parallel biases) see a slice of the sequence on
// each TP rank: ReduceGradients adds their gradients over tp once per step.
//
// With pipeline parallelism (mesh pp > 1) a rank holds the units of its stage only
// (inner/parallel/pipeline.h) and a step's micro-batches run through the stages in the configured
// schedule. Its units then stay gathered from their first use to the end of the step, and their
// gradients accumulate whole and are reduce-scattered once (as torchtitan does for PP x FSDP:
// gathering each unit once per micro-batch and pass would multiply the all-gathers by 2m).
#ifndef ATOLL_INNER_PARALLEL_FSDP_H_
#define ATOLL_INNER_PARALLEL_FSDP_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "inner/model.h"
#include "inner/parallel/mesh.h"
#include "inner/parallel/pipeline.h"
#include "inner/parallel/tensor_parallel.h"

namespace atl::inner::parallel {

struct FsdpOptions {
  bool checkpoint_activations = false;  // recompute each block's forward in backward
  bool prefetch = true;                 // gather the next unit while the current one computes
  PipelineSchedule schedule = PipelineSchedule::k1F1B;  // of a step's micro-batches
  bool sequence_parallel = false;  // with tp > 1: the blocks' activations split over the sequence
  // Forward and backward compute under bf16 autocast; the parameter shards, their gradients, the
  // gradient reduction and the optimizer stay fp32. Sharded (dp_shard > 1), the units are
  // all-gathered in bf16 (half the bytes) and computed with in bf16, their gradients reduced in
  // fp32. With tp = pp = 1 (activations cross no rank boundary).
  bool bf16 = false;
};

// One micro-batch: token ids and next-token targets, [rows, T] int64 (every stage gets both).
struct MicroBatch {
  at::Tensor inputs, targets;
};

// The part of one model parameter that this rank holds.
struct ParamShard {
  std::string name;            // the model parameter's name ("blocks.3.attn.qkv.weight")
  std::vector<int64_t> shape;  // the whole parameter's shape
  // The ranges (offset, count) of the whole parameter's canonical flat order (inner/model.h)
  // that `value` holds, in order: one without tensor parallelism, at most three with it.
  std::vector<std::pair<int64_t, int64_t>> runs;
  at::Tensor value;            // 1-D view into the unit's shard
  at::Tensor grad;             // 1-D view into the unit's shard gradient
  bool decay = false;          // a matrix: weight decay applies
  bool replica = false;        // TP rank 0 owns it: not synced, checkpointed or in the norm
  int unit = 0;
};

// Bytes this rank holds for the model's state, for the memory benchmark.
struct FsdpMemory {
  int64_t shard_bytes = 0;        // parameters + gradients (the shards)
  int64_t peak_gathered_bytes = 0;  // full units (parameters and gradients) alive at once, at most
  int gathered_element_bytes = 4;   // of the gathered parameters: 2 when sharded in bf16
};

class FsdpModel {
 public:
  static absl::StatusOr<std::unique_ptr<FsdpModel>> Create(const ModelConfig& config,
                                                         DeviceMesh& mesh,
                                                         const std::string& device,
                                                         FsdpOptions options);
  ~FsdpModel();

  // A step's micro-batches: forward and backward of each (through the pipeline's stages, in the
  // schedule's order), gradients added to the shards scaled by `grad_scale`. Returns the mean of
  // this data-parallel rank's micro-batch losses (on every stage), a double on the device: nothing
  // here waits for the device.
  absl::StatusOr<at::Tensor> ForwardBackward(const std::vector<MicroBatch>& micros,
                                             double grad_scale);
  // After the last micro-batch of a step: sums over tp the gradients that sequence parallelism
  // leaves partial (the plan's sequence_partial ones), and the shard gradients over dp_replicate.
  absl::Status ReduceGradients();
  // Mean loss of a batch, forward only.
  absl::StatusOr<double> Loss(const at::Tensor& inputs, const at::Tensor& targets);
  void ZeroGrad();
  // Sum of the squares of the gradient elements this rank owns (padding and replicas excluded),
  // a 1-element double tensor on the device.
  at::Tensor GradSquaredNorm() const;
  // Copies the values of the given shards on rank 0 of the mesh group `dim` to its other ranks,
  // which call it with their shards at the same places: TP rank 0's copies of the parameters
  // whole on every TP rank, replica 0's shards (HSDP). Nothing to do in a group of one.
  absl::Status BroadcastShards(MeshDim dim, const std::vector<size_t>& shards);
  // Multiplies the gradients by a 1-element tensor on their device (no host sync).
  void ScaleGrad(const at::Tensor& factor);

  // The last ForwardBackward's time and the part this stage spent waiting for the others.
  const PipelineTiming& pipeline_timing() const { return timing_; }
  std::vector<ParamShard>& shards() { return shards_; }
  const std::vector<ParamShard>& shards() const { return shards_; }
  CausalLm& module() { return model_; }
  const ParallelPlan& plan() const { return plan_; }
  DeviceMesh& mesh() { return mesh_; }
  // This rank's units (its stage's, in model order).
  int num_units() const { return int(units_.size()); }
  // The parameter names of unit u, in model order.
  std::vector<std::string> unit_parameters(int u) const;
  FsdpMemory memory() const;

 private:
  struct Unit;
  struct Micro;
  class StageRun;
  FsdpModel(const ModelConfig& config, DeviceMesh& mesh, FsdpOptions options);
  absl::Status BuildUnits();
  void AssignParameters();
  void FlattenUnit(size_t ui, const std::map<std::string, std::vector<int64_t>>& whole_shape);
  bool sharded() const;
  bool first_stage() const { return stage_.first == 0; }
  bool last_stage() const { return stage_.last == model_->config().n_layer + 1; }
  absl::Status Gather(int u);      // starts (if needed) and waits for u's parameters
  void Prefetch(int u);            // starts u's gather in the background
  void Release(int u);             // frees u's full parameters (sharded only)
  void PrepareGrad(int u);         // full gradient buffer of u, zeroed, behind the params' grads
  absl::Status ScatterGrad(int u);
  // After a pipelined step: scatters the gradients (unless `status` is an error) and releases
  // the units; returns the first error.
  absl::Status FinishHeldUnits(absl::Status status);
  at::Tensor RunUnit(int u, const at::Tensor& x);
  // One micro-batch through this stage's units: `input` is the previous stage's activation (the
  // tokens on the first stage). Returns the activation for the next stage (the loss on the last).
  absl::StatusOr<at::Tensor> ForwardMicro(Micro& m, const at::Tensor& input, bool train);
  // Its backward from the gradient of ForwardMicro's output (`grad_scale` on the last stage):
  // returns the gradient of its input (undefined on the first stage).
  absl::StatusOr<at::Tensor> BackwardMicro(Micro& m, const at::Tensor& grad, double grad_scale);
  // Runs `actions` over the pp group; returns the micro-batches' mean loss, on every stage.
  absl::StatusOr<at::Tensor> RunStage(const std::vector<MicroBatch>& micros,
                                      const std::vector<PipelineAction>& actions, bool train,
                                      double grad_scale);

  template <typename T>
  absl::StatusOr<T> Guarded(const std::function<absl::StatusOr<T>()>& run);

  DeviceMesh& mesh_;
  std::shared_ptr<TpGroup> tp_;  // null without tensor parallelism
  CausalLm model_;
  const ParallelPlan plan_;
  const FsdpOptions options_;
  bool on_cuda_ = false;
  StageUnits stage_;
  bool holding_ = false;  // a pipelined step: units stay gathered, gradients whole, to its end
  PipelineTiming timing_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<ParamShard> shards_;
  int64_t live_bytes_ = 0, peak_live_bytes_ = 0;
};

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_FSDP_H_
