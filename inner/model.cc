#include "inner/model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "inner/torch_compat.h"

namespace atl::inner {
namespace {

namespace F = torch::nn::functional;

absl::Status Positive(const char* key, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be positive, got ", value));
}

}  // namespace

absl::Status Validate(const ModelConfig& c) {
  for (auto [key, value] : {std::pair<const char*, int64_t>{"model.n_layer", c.n_layer},
                            {"model.d_model", c.d_model},
                            {"model.n_head", c.n_head},
                            {"model.context", c.context},
                            {"model.vocab", c.vocab}}) {
    if (auto s = Positive(key, value); !s.ok()) return s;
  }
  if (c.d_model % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_model (", c.d_model,
                                                   ") must be divisible by model.n_head (",
                                                   c.n_head, ")"));
  }
  if (c.vocab > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab must be at most 65536 (uint16 tokens), got ", c.vocab));
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dropout must be in [0, 1), got ", c.dropout));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(const ModelConfig& c) {
  const int64_t d = c.d_model;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"tok_emb.weight", {c.vocab, d}}, {"pos_emb.weight", {c.context, d}}};
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    for (auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln1.weight", {d}},
             {"ln1.bias", {d}},
             {"attn.qkv.weight", {3 * d, d}},
             {"attn.qkv.bias", {3 * d}},
             {"attn.proj.weight", {d, d}},
             {"attn.proj.bias", {d}},
             {"ln2.weight", {d}},
             {"ln2.bias", {d}},
             {"mlp.fc.weight", {4 * d, d}},
             {"mlp.fc.bias", {4 * d}},
             {"mlp.proj.weight", {d, 4 * d}},
             {"mlp.proj.bias", {d}}}) {
      shapes.emplace_back(b + name, std::move(shape));
    }
  }
  shapes.push_back({"ln_f.weight", {d}});
  shapes.push_back({"ln_f.bias", {d}});
  shapes.push_back({"head.weight", {c.vocab, d}});
  return shapes;
}

std::vector<std::pair<std::string, int64_t>> ParameterGroups(const ModelConfig& c) {
  std::vector<std::pair<std::string, int64_t>> groups;
  for (const auto& [name, shape] : ParameterShapes(c)) {
    std::string group = name;
    if (absl::StartsWith(name, "blocks.")) {
      group = name.substr(0, name.find('.', 7)) + ".*";
    } else if (absl::StartsWith(name, "ln_f.")) {
      group = "ln_f.*";
    }
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    if (groups.empty() || groups.back().first != group) groups.emplace_back(group, 0);
    groups.back().second += numel;
  }
  return groups;
}

int64_t ParameterCount(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& [name, count] : ParameterGroups(c)) n += count;
  return n;
}

double TrainFlopsPerToken(const ModelConfig& c) {
  // Kaplan et al.: 6 FLOPs per parameter per token (forward + backward), minus the position
  // embedding lookups, plus attention scores and values: 6 * n_layer * context * d_model.
  const double n = double(ParameterCount(c)) - double(c.context) * c.d_model;
  return 6.0 * n + 6.0 * c.n_layer * c.context * c.d_model;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& c)
    : n_head_(c.n_head), dropout_(c.dropout) {
  qkv_ = register_module("qkv", torch::nn::Linear(c.d_model, 3 * c.d_model));
  proj_ = register_module("proj", torch::nn::Linear(c.d_model, c.d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  auto qkv = qkv_->forward(x).view({b, t, 3, n_head_, d / n_head_}).permute({2, 0, 3, 1, 4});
  auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]);
  y = y.transpose(1, 2).contiguous().view({b, t, d});
  return F::dropout(proj_->forward(y), F::DropoutFuncOptions().p(dropout_).training(is_training()));
}

MlpImpl::MlpImpl(const ModelConfig& c) {
  fc_ = register_module("fc", torch::nn::Linear(c.d_model, 4 * c.d_model));
  proj_ = register_module("proj", torch::nn::Linear(4 * c.d_model, c.d_model));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return proj_->forward(torch::gelu(fc_->forward(x), "tanh"));
}

BlockImpl::BlockImpl(const ModelConfig& c) : dropout_(c.dropout) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn_ = register_module("attn", CausalSelfAttention(c));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  mlp_ = register_module("mlp", Mlp(c));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn_->forward(ln1_->forward(x));
  auto m = mlp_->forward(ln2_->forward(x));
  return x + F::dropout(m, F::DropoutFuncOptions().p(dropout_).training(is_training()));
}

GptImpl::GptImpl(const ModelConfig& c) : config_(c) {
  tok_emb_ = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.d_model));
  pos_emb_ = register_module("pos_emb", torch::nn::Embedding(c.context, c.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < c.n_layer; ++i) blocks_->push_back(Block(c));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  head_ = register_module("head", torch::nn::Linear(
                                      torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));

  // Deterministic init, independent of the global generator and of registration side effects.
  torch::NoGradGuard no_grad;
  auto gen = compat::MakeCpuGenerator(c.init_seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (auto& [name, p] : NamedParameters(*this)) {
    if (absl::EndsWith(name, ".bias")) {
      p.zero_();
    } else if (absl::StartsWith(name, "ln") || absl::StrContains(name, ".ln")) {
      p.fill_(1.0);
    } else if (absl::EndsWith(name, "attn.proj.weight") || absl::EndsWith(name, "mlp.proj.weight")) {
      p.normal_(0.0, residual_std, gen);
    } else {
      p.normal_(0.0, 0.02, gen);
    }
  }
}

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  auto pos = torch::arange(t, tokens.options().dtype(torch::kLong));
  auto x = tok_emb_->forward(tokens) + pos_emb_->forward(pos);
  return F::dropout(x, F::DropoutFuncOptions().p(config_.dropout).training(is_training()));
}

torch::Tensor GptImpl::RunBlock(int i, const torch::Tensor& x) {
  return blocks_[size_t(i)]->as<Block>()->forward(x);
}

torch::Tensor GptImpl::Logits(const torch::Tensor& x) { return head_->forward(ln_f_->forward(x)); }

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  auto x = Embed(tokens);
  for (int i = 0; i < config_.n_layer; ++i) x = RunBlock(i, x);
  return Logits(x);
}

torch::Tensor GptImpl::Loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto logits = forward(tokens);
  return F::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace atl::inner
