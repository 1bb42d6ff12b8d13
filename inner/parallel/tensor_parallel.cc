#include "inner/parallel/tensor_parallel.h"

#include <torch/torch.h>

#include <stdexcept>

#include "absl/strings/str_cat.h"

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

// f and the column-parallel layer, sequence-parallel: the ranks' slices gathered and multiplied
// by this rank's rows of the weight (the bias, if any, is added after, outside: a custom function
// takes no undefined input in libtorch 1.13). Only the slice is kept for backward, which gathers it
// again for the weight's gradient (Megatron's trade: activation memory for one more all-gather),
// and the input's gradient is reduce-scattered back to the slices.
struct GatherLinearFunction : public torch::autograd::Function<GatherLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->save_for_backward({x, weight});
    return torch::nn::functional::linear(
        reinterpret_cast<TpGroup*>(group)->GatherSequenceOrThrow(x), weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TpGroup* tp = GroupOf(ctx);
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor whole = tp->GatherSequenceOrThrow(saved[0]);
    const torch::Tensor& weight = saved[1];
    const torch::Tensor g = grads[0].contiguous();
    // In the output gradient's precision (bf16 under autocast), each gradient in its input's.
    const auto dtype = g.scalar_type();
    const auto rows = g.view({-1, g.size(-1)});
    torch::Tensor grad_weight = rows.t().mm(whole.reshape({-1, whole.size(-1)}).to(dtype));
    torch::Tensor grad_x = tp->ReduceScatterSequenceOrThrow(g.matmul(weight.to(dtype)));
    return {grad_x.to(saved[0].scalar_type()), grad_weight.to(weight.scalar_type()),
            torch::Tensor()};
  }
};

// g: the ranks' partial outputs of a row-parallel layer summed forward; identity backward.
// Sequence-parallel: the sum reduce-scattered forward, the slices' gradients gathered backward.
struct ReduceFunction : public torch::autograd::Function<ReduceFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    auto* tp = reinterpret_cast<TpGroup*>(group);
    if (tp->sequence_parallel()) return tp->ReduceScatterSequenceOrThrow(x);
    torch::Tensor y = x.contiguous().clone();
    tp->AllReduceOrThrow(y);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TpGroup* tp = GroupOf(ctx);
    if (tp->sequence_parallel()) return {tp->GatherSequenceOrThrow(grads[0]), torch::Tensor()};
    return {grads[0], torch::Tensor()};
  }
};

// Sequence-parallel entry of the whole embeddings: the rank's slice, the slices' gradients
// gathered backward (every rank then holds the embeddings' whole gradient).
struct SplitFunction : public torch::autograd::Function<SplitFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return reinterpret_cast<TpGroup*>(group)->SliceSequence(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {GroupOf(ctx)->GatherSequenceOrThrow(grads[0]), torch::Tensor()};
  }
};

// Sequence-parallel exit to the whole head: the slices gathered; every rank computes the same
// loss from them, so the gradient of its slice is its slice of the (same) whole gradient.
struct JoinFunction : public torch::autograd::Function<JoinFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return reinterpret_cast<TpGroup*>(group)->GatherSequenceOrThrow(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {GroupOf(ctx)->SliceSequence(grads[0]), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor TpGroup::ColumnParallel(const torch::Tensor& x, const torch::Tensor& weight,
                                      const torch::Tensor& bias) {
  const auto group = reinterpret_cast<int64_t>(this);
  if (sequence_parallel_) {
    auto y = GatherLinearFunction::apply(x, weight, group);
    return bias.defined() ? y + bias : y;
  }
  return torch::nn::functional::linear(EnterFunction::apply(x, group), weight, bias);
}

torch::Tensor TpGroup::RowParallel(const torch::Tensor& y, const torch::Tensor& weight,
                                   const torch::Tensor& bias) {
  // The partial products are summed before the (whole) bias is added once.
  auto sum = ReduceFunction::apply(torch::nn::functional::linear(y, weight),
                                   reinterpret_cast<int64_t>(this));
  return bias.defined() ? sum + bias : sum;
}

torch::Tensor TpGroup::Split(const torch::Tensor& x) {
  if (!sequence_parallel_) return x;
  return SplitFunction::apply(x, reinterpret_cast<int64_t>(this));
}

torch::Tensor TpGroup::Join(const torch::Tensor& x) {
  if (!sequence_parallel_) return x;
  return JoinFunction::apply(x, reinterpret_cast<int64_t>(this));
}

torch::Tensor TpGroup::Dropout(const torch::Tensor& x, double p, bool training) {
  if (!sequence_parallel_ || !training || p == 0) {
    return torch::nn::functional::dropout(
        x, torch::nn::functional::DropoutFuncOptions().p(p).training(training));
  }
  const int64_t slice = x.size(1);
  auto noise = torch::empty({x.size(0), slice * size(), x.size(2)}, x.options());
  noise.bernoulli_(1 - p).div_(1 - p);
  return x * noise.narrow(1, rank() * slice, slice);
}

namespace {

class ColumnStyle : public LinearStyle {
 public:
  explicit ColumnStyle(std::shared_ptr<TpGroup> group) : group_(std::move(group)) {}
  torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    return group_->ColumnParallel(x, weight, bias);
  }

 private:
  std::shared_ptr<TpGroup> group_;
};

class RowStyle : public LinearStyle {
 public:
  explicit RowStyle(std::shared_ptr<TpGroup> group) : group_(std::move(group)) {}
  torch::Tensor Forward(const torch::Tensor& y, const torch::Tensor& weight,
                        const torch::Tensor& bias) override {
    return group_->RowParallel(y, weight, bias);
  }

 private:
  std::shared_ptr<TpGroup> group_;
};

}  // namespace

void SliceForTensorParallel(CausalLmImpl& model, const ParallelPlan& plan, int rank, int size) {
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : NamedParameters(model)) {
    const ParamPlan pp = PlanOf(plan, name);
    if (pp.style == TpStyle::kReplicated) continue;
    p.set_data(TpLocalPart(pp, p.detach(), rank, size));
  }
}

void ApplyTensorParallel(CausalLmImpl& model, const ParallelPlan& plan,
                         std::shared_ptr<TpGroup> group) {
  SliceForTensorParallel(model, plan, group->rank(), group->size());
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = item.value()->as<LinearImpl>();
    if (linear == nullptr) continue;
    const ParamPlan pp = PlanOf(plan, item.key() + ".weight");
    if (pp.style == TpStyle::kColumn) linear->set_style(std::make_shared<ColumnStyle>(group));
    if (pp.style == TpStyle::kRow) linear->set_style(std::make_shared<RowStyle>(group));
  }
  if (group->sequence_parallel()) model.SetSequenceStyle(group);
}

// bf16 activations and gradients (autocast) are summed in fp32 and gathered as 16-bit words by
// the communicator.
void TpGroup::AllReduceOrThrow(torch::Tensor& t) {
  if (auto s = group_.AllReduceSum(t); !s.ok()) Fail(s);
}

torch::Tensor TpGroup::GatherSequenceOrThrow(const torch::Tensor& slice) {
  const int64_t n = size();
  const torch::Tensor part = slice.contiguous();
  auto flat = torch::empty({n * part.numel()}, part.options());
  if (auto s = group_.AllGather(part.view({-1}), flat); !s.ok()) Fail(s);
  // [n, B, T / n, ...] -> [B, n, T / n, ...] = [B, T, ...]
  std::vector<int64_t> shape = part.sizes().vec();
  shape.insert(shape.begin(), n);
  std::vector<int64_t> whole = part.sizes().vec();
  whole[1] *= n;
  return flat.view(shape).transpose(0, 1).reshape(whole);
}

torch::Tensor TpGroup::ReduceScatterSequenceOrThrow(const torch::Tensor& whole) {
  const int64_t n = size();
  std::vector<int64_t> slice = SliceSequence(whole).sizes().vec();  // checks the length
  // [B, T, ...] -> [B, n, T / n, ...] -> [n, B, T / n, ...]: rank r's part is the r-th block.
  std::vector<int64_t> split = slice;
  split.insert(split.begin() + 1, n);
  auto arranged = whole.reshape(split).transpose(0, 1).clone(at::MemoryFormat::Contiguous)
                      .view({-1});
  auto mine = torch::empty({arranged.numel() / n}, whole.options());
  if (auto s = group_.ReduceScatterSum(arranged, mine); !s.ok()) Fail(s);
  return mine.view(slice);
}

torch::Tensor TpGroup::SliceSequence(const torch::Tensor& whole) {
  const int64_t n = size(), t = whole.size(1);
  if (t % n != 0) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "sequence parallelism: ", t, " positions do not split over ", n,
        " tensor-parallel ranks")));
  }
  return whole.narrow(1, rank() * (t / n), t / n).clone(at::MemoryFormat::Contiguous);
}

void TpGroup::Fail(const absl::Status& s) {
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
