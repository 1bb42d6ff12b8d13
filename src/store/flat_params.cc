#include "src/store/flat_params.h"

#include <torch/torch.h>

#include <cstring>


namespace atl {

outer::FragmentLayout LayoutOf(const NamedParams& params) {
  outer::FragmentLayout layout;
  for (const auto& [name, p] : params) {
    layout.names.push_back(name);
    layout.numels.push_back(uint64_t(p.numel()));
  }
  return layout;
}

std::vector<float> Flatten(const inner::ParallelPlan& plan, const NamedParams& params) {
  size_t total = 0;
  for (const auto& [name, p] : params) total += size_t(p.numel());
  std::vector<float> flat(total);
  size_t offset = 0;
  for (const auto& [name, p] : params) {
    auto c = inner::CanonicalFlat(inner::PlanOf(plan, name),
                                  p.detach().to(torch::kCPU, torch::kFloat))
                 .contiguous();
    std::memcpy(flat.data() + offset, c.data_ptr<float>(), size_t(c.numel()) * sizeof(float));
    offset += size_t(c.numel());
  }
  return flat;
}

void LoadFlat(const inner::ParallelPlan& plan, const std::vector<float>& flat,
              const NamedParams& params) {
  torch::NoGradGuard no_grad;
  size_t offset = 0;
  for (const auto& [name, p] : params) {
    auto src = inner::ShapedView(
        inner::PlanOf(plan, name), torch::from_blob(const_cast<float*>(flat.data() + offset), {p.numel()}, torch::kFloat),
        p.sizes());
    p.copy_(src);
    offset += size_t(p.numel());
  }
}

std::vector<float> Flatten(const inner::ParallelPlan& plan, const NamedParams& params,
                           const std::vector<size_t>& subset) {
  NamedParams picked;
  for (size_t i : subset) picked.push_back(params[i]);
  return Flatten(plan, picked);
}

void LoadFlat(const inner::ParallelPlan& plan, const std::vector<float>& flat,
              const NamedParams& params, const std::vector<size_t>& subset, double alpha) {
  torch::NoGradGuard no_grad;
  size_t offset = 0;
  for (size_t i : subset) {
    const auto& [name, p] = params[i];
    auto src = inner::ShapedView(
        inner::PlanOf(plan, name), torch::from_blob(const_cast<float*>(flat.data() + offset), {p.numel()}, torch::kFloat),
        p.sizes());
    if (alpha == 0.0) {
      p.copy_(src);
    } else {
      p.mul_(alpha).add_(src.to(p.device()), 1.0 - alpha);
    }
    offset += size_t(p.numel());
  }
}

}  // namespace atl
