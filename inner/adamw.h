// AdamW with its state keyed by parameter name. The arithmetic is torch::optim::AdamW's, op for op
// (a test holds them bit-identical); atoll owns the state so that checkpoints, fragments and
// parameter shards address moments by the same stable names as the parameters. torch's C++
// optimizer keys state by TensorImpl address, and that key type changed between 1.13 and 2.x.
#ifndef ATOLL_INNER_ADAMW_H_
#define ATOLL_INNER_ADAMW_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "inner/train_config.h"

namespace atl::inner {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// A parameter (or the part of one a rank owns) and where its gradient is. An undefined grad means
// param.grad().
struct AdamWParam {
  std::string name;
  at::Tensor param;
  at::Tensor grad;
  bool decay = false;  // weight decay applies (matrices)
};

class AdamW {
 public:
  // Weight decay for parameters of dim >= 2, gradients in .grad().
  AdamW(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions options);
  AdamW(std::vector<AdamWParam> params, AdamWOptions options);

  // One update with learning rate lr from the gradients in params' .grad().
  void Step(double lr);
  void ZeroGrad();
  // Forget the moments (an island joining mid-run starts fresh).
  void Reset();

  int64_t step() const { return step_; }
  // "exp_avg/<param>" and "exp_avg_sq/<param>" for every parameter, in parameter order.
  std::vector<NamedTensor> State() const;
  // Slot i's moments, named "exp_avg" and "exp_avg_sq" (without the parameter's name).
  std::vector<NamedTensor> SlotState(size_t i) const;
  // All-or-nothing: on a missing name or a shape mismatch nothing changes.
  absl::Status LoadState(int64_t step, const std::vector<NamedTensor>& state);
  // The moments as State() lists them are written in place by their owner; this sets the count.
  void SetStep(int64_t step) { step_ = step; }

 private:
  struct Slot {
    std::string name;
    at::Tensor param, grad, exp_avg, exp_avg_sq;
    bool decay;
  };
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

}  // namespace atl::inner

#endif  // ATOLL_INNER_ADAMW_H_
