// The collectives of tensor parallelism over the mesh's tp group, as
// autograd functions: identity forward and all-reduce of the gradient backward before each
// column-parallel layer, all-reduce forward and identity backward after each row-parallel one;
// with sequence parallelism, all-gathers and reduce-scatters of the sequence dimension instead
// (inner/model.h). A collective that fails inside forward or backward throws (autograd has
// no status); the caller catches it and returns status(), the collective's own error.
#ifndef ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_
#define ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_

#include <mutex>

#include "absl/status/status.h"
#include "inner/model.h"
#include "inner/model/layers.h"
#include "inner/parallel/communicator.h"

namespace atl::inner::parallel {

// Tensor parallelism (Megatron style) applied to a plain model by its family's plan
// (inner/model/plan.h): each column-parallel linear holds its output rows (of every part alike:
// q, k and v of a fused qkv) and each row-parallel one its input columns; everything else is whole
// on every rank. Sequence parallelism (Korthikanti et al.) on top: between the blocks' tensor-
// parallel regions each rank holds its 1/size slice of the sequence (dimension 1 of [B, T, d]),
// so the norms, the dropouts and the residual stream compute and keep 1/size of the activations.
// A column-parallel layer then all-gathers its input's sequence (reduce-scatters the gradient) and
// keeps only the slice for backward, where it gathers it again; a row-parallel layer
// reduce-scatters its output (gathers the gradient): the same bytes as the all-reduces, plus one
// all-gather per column-parallel layer in backward. The embeddings run whole and Split keeps the
// rank's slice; Join gathers it back before the head, which runs whole. The replicated parameters
// of the blocks see a slice each: their gradients are partial sums, added over the ranks once per
// step (inner/parallel/fsdp).
class TpGroup : public SequenceStyle {
 public:
  TpGroup(Communicator& group, bool sequence_parallel)
      : group_(group), sequence_parallel_(sequence_parallel) {}
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  bool sequence_parallel() const { return sequence_parallel_; }
  // x W^T + b with this rank's output rows of W and b, for an input every rank holds (its
  // gradient summed over the ranks) or, sequence-parallel, the ranks' slices of it.
  torch::Tensor ColumnParallel(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias);
  // The ranks' partial products y W^T (this rank's input columns of W) summed, then b (whole)
  // added; sequence-parallel, the rank's slice of the sum.
  torch::Tensor RowParallel(const torch::Tensor& y, const torch::Tensor& weight,
                            const torch::Tensor& bias);
  // Sequence-parallel only (identity otherwise): the rank's slice of a tensor every rank holds
  // whole (gathered backward), and the whole of a sliced one (sliced backward).
  torch::Tensor Split(const torch::Tensor& x) override;
  torch::Tensor Join(const torch::Tensor& x) override;
  // The rank's slice of the mask the whole sequence draws: the same draws as without sequence
  // parallelism (dropout's own: one Bernoulli per element of the whole shape, scaled by 1/(1-p)),
  // and the ranks' generators stay in step.
  torch::Tensor Dropout(const torch::Tensor& x, double p, bool training) override;

  // The collectives, each throwing after recording its error. Sums `t` over the group in place:
  void AllReduceOrThrow(torch::Tensor& t);
  // [B, T / size, ...] slices in rank order -> [B, T, ...]:
  torch::Tensor GatherSequenceOrThrow(const torch::Tensor& slice);
  // [B, T, ...] summed over the group -> this rank's [B, T / size, ...]:
  torch::Tensor ReduceScatterSequenceOrThrow(const torch::Tensor& whole);
  // This rank's slice of [B, T, ...] (no collective; throws when T does not divide by size).
  torch::Tensor SliceSequence(const torch::Tensor& whole);
  // The first error of a collective (OK when none failed).
  absl::Status status() const;

 private:
  // Records the error and throws it.
  [[noreturn]] void Fail(const absl::Status& s);

  Communicator& group_;
  const bool sequence_parallel_;
  mutable std::mutex mu_;
  absl::Status status_;
};

// Each of the plan's tensor-parallel parameters of `model` becomes rank `rank` of `size`'s part of
// it (the rest stays whole). The module's parameters change shape; no collective runs.
void SliceForTensorParallel(CausalLmImpl& model, const ParallelPlan& plan, int rank, int size);
// SliceForTensorParallel for the group's rank, then the plan's linears compute column- or
// row-parallel over the group (which must outlive the model), and with sequence parallelism the
// residual stream splits over it.
void ApplyTensorParallel(CausalLmImpl& model, const ParallelPlan& plan,
                         std::shared_ptr<TpGroup> group);

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_
