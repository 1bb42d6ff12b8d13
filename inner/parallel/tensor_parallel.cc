#include "inner/parallel/tensor_parallel.h"

#include <torch/torch.h>

#include <stdexcept>

namespace atl::inner::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

TpGroup* GroupOf(AutogradContext* ctx) {
  return reinterpret_cast<TpGroup*>(ctx->saved_data["group"].toInt());
}

// f: identity forward; the gradients of the ranks' column-parallel layers are summed backward.
struct EnterFunction : public torch::autograd::Function<EnterFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::Tensor g = grads[0].contiguous().clone();
    GroupOf(ctx)->AllReduceOrThrow(g);
    return {g, torch::Tensor()};
  }
};

// g: the ranks' partial outputs of a row-parallel layer summed forward; identity backward.
struct ReduceFunction : public torch::autograd::Function<ReduceFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    torch::Tensor y = x.contiguous().clone();
    reinterpret_cast<TpGroup*>(group)->AllReduceOrThrow(y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TpGroup::Enter(const torch::Tensor& x) {
  return EnterFunction::apply(x, reinterpret_cast<int64_t>(this));
}

torch::Tensor TpGroup::Reduce(const torch::Tensor& x) {
  return ReduceFunction::apply(x, reinterpret_cast<int64_t>(this));
}

void TpGroup::AllReduceOrThrow(torch::Tensor& t) {
  absl::Status s = group_.AllReduceSum(t);
  if (s.ok()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = s;
  }
  throw std::runtime_error(std::string(s.message()));
}

absl::Status TpGroup::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

}  // namespace atl::inner::parallel
