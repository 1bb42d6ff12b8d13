#include "inner/adamw.h"

#include <ATen/ATen.h>

#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace atl::inner {

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> params, AdamWOptions options)
    : options_(options) {
  for (auto& [name, p] : params) {
    slots_.push_back({name, p, at::Tensor(), at::zeros_like(p, at::MemoryFormat::Preserve),
                      at::zeros_like(p, at::MemoryFormat::Preserve), p.dim() >= 2});
  }
}

AdamW::AdamW(std::vector<AdamWParam> params, AdamWOptions options) : options_(options) {
  for (auto& p : params) {
    slots_.push_back({p.name, p.param, p.grad, at::zeros_like(p.param, at::MemoryFormat::Preserve),
                      at::zeros_like(p.param, at::MemoryFormat::Preserve), p.decay});
  }
}

void AdamW::Step(double lr) {
  at::NoGradGuard no_grad;
  step_ += 1;
  const double bias_correction1 = 1 - std::pow(options_.beta1, double(step_));
  const double bias_correction2 = 1 - std::pow(options_.beta2, double(step_));
  const double step_size = lr / bias_correction1;
  for (auto& s : slots_) {
    const at::Tensor& grad = s.grad.defined() ? s.grad : s.param.grad();
    if (!grad.defined()) continue;
    if (s.decay && options_.weight_decay != 0) s.param.mul_(1 - lr * options_.weight_decay);
    s.exp_avg.mul_(options_.beta1).add_(grad, 1 - options_.beta1);
    s.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1 - options_.beta2);
    auto denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    s.param.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

void AdamW::ZeroGrad() {
  for (auto& s : slots_) {
    if (s.grad.defined()) {
      s.grad.zero_();
    } else if (s.param.grad().defined()) {
      s.param.mutable_grad().zero_();
    }
  }
}

void AdamW::Reset() {
  step_ = 0;
  for (auto& s : slots_) {
    s.exp_avg.zero_();
    s.exp_avg_sq.zero_();
  }
}

std::vector<NamedTensor> AdamW::State() const {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    for (auto& t : SlotState(i)) out.push_back({t.name + "/" + slots_[i].name, t.tensor});
  }
  return out;
}

std::vector<NamedTensor> AdamW::SlotState(size_t i) const {
  return {{"exp_avg", slots_[i].exp_avg}, {"exp_avg_sq", slots_[i].exp_avg_sq}};
}

absl::Status AdamW::LoadState(int64_t step, const std::vector<NamedTensor>& state) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("negative AdamW step ", step));
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& t : state) by_name[t.name] = &t.tensor;
  std::vector<std::pair<at::Tensor, const at::Tensor*>> copies;
  for (const auto& s : slots_) {
    for (const auto* target : {&s.exp_avg, &s.exp_avg_sq}) {
      const std::string name = (target == &s.exp_avg ? "exp_avg/" : "exp_avg_sq/") + s.name;
      auto it = by_name.find(name);
      if (it == by_name.end()) return absl::NotFoundError(absl::StrCat("missing AdamW state ", name));
      if (it->second->sizes() != target->sizes() || it->second->dtype() != target->dtype()) {
        return absl::InvalidArgumentError(absl::StrCat("AdamW state ", name, " has shape ",
                                                       c10::str(it->second->sizes()), ", expected ",
                                                       c10::str(target->sizes())));
      }
      copies.emplace_back(*target, it->second);
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(*src);
  step_ = step;
  return absl::OkStatus();
}

}  // namespace atl::inner
