#include "tests/inner/toy_family.h"

#include <torch/torch.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "inner/model.h"

namespace atl::testing::toy {
namespace {

using inner::Linear;
using inner::ModelConfig;
using inner::ParallelPlan;
using inner::ParamShapes;
using inner::TpStyle;

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& c) {
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    fc_ = register_module("fc", Linear(c.d_model, 2 * c.d_model));
    proj_ = register_module("proj", Linear(2 * c.d_model, c.d_model));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x + proj_->forward(torch::gelu(fc_->forward(norm_->forward(x))));
  }

 private:
  torch::nn::LayerNorm norm_{nullptr};
  Linear fc_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(Block);

class ToyImpl : public inner::CausalLmImpl {
 public:
  explicit ToyImpl(const ModelConfig& c) : CausalLmImpl(c) {
    embed_ = register_module("embed", torch::nn::Embedding(c.vocab, c.d_model));
    layers_ = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < c.n_layer; ++i) layers_->push_back(Block(c));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head_ = register_module("head", Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
    inner::InitializeParameters(*this, kFamily.plan(c));
  }
  torch::Tensor Embed(const torch::Tensor& tokens) override {
    auto x = embed_->forward(tokens);
    return style_ ? style_->Split(x) : x;
  }
  torch::Tensor RunBlock(int i, const torch::Tensor& x) override {
    return layers_[size_t(i)]->as<Block>()->forward(x);
  }
  torch::Tensor Logits(const torch::Tensor& x) override {
    return head_->forward(norm_->forward(style_ ? style_->Join(x) : x));
  }
  void SetSequenceStyle(std::shared_ptr<inner::SequenceStyle> style) override { style_ = style; }
  // No position sees another: the cache only counts positions.
  torch::Tensor Decode(const torch::Tensor& tokens, inner::KvCache& cache) override {
    auto x = embed_->forward(tokens);
    for (int i = 0; i < num_blocks(); ++i) x = RunBlock(i, x);
    cache.length += tokens.size(1);
    return head_->forward(norm_->forward(x));
  }

 private:
  std::shared_ptr<inner::SequenceStyle> style_;
  torch::nn::Embedding embed_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  Linear head_{nullptr};
};

ParamShapes Shapes(const ModelConfig& c) {
  const int64_t d = c.d_model;
  ParamShapes shapes = {{"embed.weight", {c.vocab, d}}};
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string b = absl::StrCat("layers.", l, ".");
    for (auto& [name, shape] : ParamShapes{{"norm.weight", {d}},
                                           {"norm.bias", {d}},
                                           {"fc.weight", {2 * d, d}},
                                           {"fc.bias", {2 * d}},
                                           {"proj.weight", {d, 2 * d}},
                                           {"proj.bias", {d}}}) {
      shapes.emplace_back(b + name, std::move(shape));
    }
  }
  shapes.push_back({"norm.weight", {d}});
  shapes.push_back({"norm.bias", {d}});
  shapes.push_back({"head.weight", {c.vocab, d}});
  return shapes;
}

ParallelPlan Plan(const ModelConfig&) {
  ParallelPlan p;
  p.blocks = "layers";
  p.embeddings = {"embed"};
  p.tensor_parallel = {{"layers.*.fc", TpStyle::kColumn, 1}, {"layers.*.proj", TpStyle::kRow, 1}};
  return p;
}

inner::CausalLm Build(const ModelConfig& c) { return std::make_shared<ToyImpl>(c); }

double TrainFlops(const ModelConfig& c) { return 6.0 * double(inner::ParameterCount(c)); }

absl::Status ValidateTensorParallel(const ModelConfig& c, int tp) {
  if ((2 * c.d_model) % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", tp, " must divide 2 d_model"));
  }
  return absl::OkStatus();
}

std::string HeadsText(const ModelConfig&) { return "no attention"; }

}  // namespace

const inner::ModelFamily kFamily = {.name = "toy",
                                    .title = "Toy",
                                    .shapes = Shapes,
                                    .plan = Plan,
                                    .train_flops_per_token = TrainFlops,
                                    .validate_tensor_parallel = ValidateTensorParallel,
                                    .validate = nullptr,
                                    .settings = {},
                                    .heads_text = HeadsText,
                                    .from_shapes = nullptr,
                                    .hf = nullptr};

void Register() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)inner::RegisterFamily(&kFamily);
    (void)inner::RegisterModule(kFamily.name, Build);
  });
}

}  // namespace atl::testing::toy
