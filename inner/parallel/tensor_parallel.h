// The collectives of tensor parallelism (inner::TensorParallel) over the mesh's tp group, as
// autograd functions: Enter (identity forward, all-reduce of the gradient backward) before each
// column-parallel layer, Reduce (all-reduce forward, identity backward) after each row-parallel
// one. A collective that fails inside forward or backward throws (autograd has no status); the
// caller catches it and returns status(), the collective's own error.
#ifndef ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_
#define ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_

#include <mutex>

#include "absl/status/status.h"
#include "inner/model.h"
#include "inner/parallel/communicator.h"

namespace atl::inner::parallel {

class TpGroup : public TensorParallel {
 public:
  explicit TpGroup(Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  torch::Tensor Enter(const torch::Tensor& x) override;
  torch::Tensor Reduce(const torch::Tensor& x) override;

  // Sums `t` over the group in place; throws after recording the error.
  void AllReduceOrThrow(torch::Tensor& t);
  // The first error of a collective (OK when none failed).
  absl::Status status() const;

 private:
  Communicator& group_;
  mutable std::mutex mu_;
  absl::Status status_;
};

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_TENSOR_PARALLEL_H_
