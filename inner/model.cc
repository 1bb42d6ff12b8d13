#include "inner/model.h"

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/model/gpt/gpt_family.h"
#include "inner/model/llama/llama_family.h"
#include "inner/torch_compat.h"

namespace atl::inner {
namespace {

namespace F = torch::nn::functional;

}  // namespace

torch::Tensor CausalLmImpl::forward(const torch::Tensor& tokens) {
  auto x = Embed(tokens);
  for (int i = 0; i < num_blocks(); ++i) x = RunBlock(i, x);
  return Logits(x);
}

torch::Tensor CausalLmImpl::Loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto logits = forward(tokens);
  return F::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

torch::Tensor ResidualDropout(const torch::Tensor& x, double p, bool training,
                              SequenceStyle* style) {
  if (style != nullptr) return style->Dropout(x, p, training);
  return F::dropout(x, F::DropoutFuncOptions().p(p).training(training));
}

void InitializeParameters(CausalLmImpl& model, const ParallelPlan& plan) {
  torch::NoGradGuard no_grad;
  const ModelConfig& c = model.config();
  auto gen = compat::MakeCpuGenerator(c.init_seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (const auto& [name, p] : NamedParameters(model)) {
    auto whole = torch::empty(p.sizes(), p.options());
    if (absl::EndsWith(name, ".bias")) {
      whole.zero_();
    } else if (p.dim() == 1) {  // a norm's gain
      whole.fill_(1.0);
    } else if (PlanOf(plan, name).input_major) {  // the residual projections
      whole.normal_(0.0, residual_std, gen);
    } else {
      whole.normal_(0.0, 0.02, gen);
    }
    p.copy_(whole);
  }
}

namespace {

// The torch side of the family table: each family's module, by model.arch.
struct Modules {
  std::mutex mu;
  std::map<std::string, ModuleBuilder> by_arch{{gpt::kFamily.name, gpt::Build},
                                               {llama::kFamily.name, llama::Build}};
};
Modules& modules() {
  static Modules* m = new Modules();
  return *m;
}

}  // namespace

absl::Status RegisterModule(const std::string& arch, ModuleBuilder build) {
  Modules& m = modules();
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.by_arch.emplace(arch, build).second) {
    return absl::AlreadyExistsError(absl::StrCat("model.arch \"", arch, "\" has a module already"));
  }
  return absl::OkStatus();
}

CausalLm BuildModel(const ModelConfig& config) {
  const std::string arch = FamilyOf(config).name;
  ModuleBuilder build = nullptr;
  {
    Modules& m = modules();
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.by_arch.find(arch);
    if (it != m.by_arch.end()) build = it->second;
  }
  // A family without a module is a programming error (RegisterModule beside RegisterFamily).
  if (build == nullptr) throw std::logic_error("model.arch \"" + arch + "\" has no module");
  return build(config);
}

torch::Tensor ShapedView(const ParamPlan& plan, const torch::Tensor& flat,
                         torch::IntArrayRef shape) {
  if (plan.input_major && shape.size() == 2) return flat.view({shape[1], shape[0]}).t();
  return flat.view(shape);
}

torch::Tensor CanonicalFlat(const ParamPlan& plan, const torch::Tensor& param) {
  if (plan.input_major && param.dim() == 2) return param.t().reshape({-1});
  return param.reshape({-1});
}

torch::Tensor TpLocalPart(const ParamPlan& plan, const torch::Tensor& whole, int rank, int size) {
  const auto flat = CanonicalFlat(plan, whole);
  std::vector<torch::Tensor> pieces;
  for (const auto& [offset, count] : TpRanges(plan, whole.sizes().vec(), rank, size)) {
    pieces.push_back(flat.narrow(0, offset, count));
  }
  return ShapedView(plan, torch::cat(pieces), TpLocalShape(plan, whole.sizes().vec(), size))
      .clone();
}

std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace atl::inner
