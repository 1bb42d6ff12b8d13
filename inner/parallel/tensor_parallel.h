// The collectives of tensor parallelism (inner::TensorParallel) over the mesh's tp group, as
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
#include "inner/parallel/communicator.h"

namespace atl::inner::parallel {

class TpGroup : public TensorParallel {
 public:
  TpGroup(Communicator& group, bool sequence_parallel)
      : group_(group), sequence_parallel_(sequence_parallel) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  bool sequence_parallel() const override { return sequence_parallel_; }
  torch::Tensor ColumnParallel(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) override;
  torch::Tensor RowParallel(const torch::Tensor& y, const torch::Tensor& weight,
                            const torch::Tensor& bias) override;
  torch::Tensor Split(const torch::Tensor& x) override;
  torch::Tensor Join(const torch::Tensor& x) override;

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

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_
