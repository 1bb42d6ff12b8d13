#include "inner/model.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/torch_compat.h"

namespace atl::inner {
namespace {

namespace F = torch::nn::functional;

}  // namespace

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

bool FlatInputMajor(const std::string& name) {
  return absl::EndsWith(name, "attn.proj.weight") || absl::EndsWith(name, "mlp.proj.weight");
}

torch::Tensor ShapedView(const std::string& name, const torch::Tensor& flat,
                         torch::IntArrayRef shape) {
  if (FlatInputMajor(name) && shape.size() == 2) return flat.view({shape[1], shape[0]}).t();
  return flat.view(shape);
}

torch::Tensor CanonicalFlat(const std::string& name, const torch::Tensor& param) {
  if (FlatInputMajor(name) && param.dim() == 2) return param.t().reshape({-1});
  return param.reshape({-1});
}

double TrainFlopsPerToken(const ModelConfig& c) {
  // Kaplan et al.: 6 FLOPs per parameter per token (forward + backward), minus the position
  // embedding lookups, plus attention scores and values: 6 * n_layer * context * d_model.
  const double n = double(ParameterCount(c)) - double(c.context) * c.d_model;
  return 6.0 * n + 6.0 * c.n_layer * c.context * c.d_model;
}

namespace {

// How a parameter splits over tensor-parallel ranks: by rows of its canonical flat order (an
// output row of a column-parallel weight; an input column of a row-parallel one, which flattens
// input-major), in `parts` equal parts split alike (q, k and v of attn.qkv), or not at all.
struct TpSplit {
  int parts = 0;  // 0: whole on every rank
};

TpSplit SplitOf(const std::string& name) {
  if (absl::StrContains(name, "attn.qkv.")) return {3};
  if (absl::StrContains(name, "mlp.fc.")) return {1};
  if (FlatInputMajor(name)) return {1};
  return {0};
}

int SizeOr1(TensorParallel* tp) { return tp == nullptr ? 1 : tp->size(); }

}  // namespace

absl::Status ValidateTensorParallel(const ModelConfig& c, int tp, bool sequence_parallel) {
  if (tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel degree must be positive, got ", tp));
  }
  if (c.n_head % tp != 0 || c.d_model % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.tensor_parallel_degree = ", tp, " must divide model.n_head (", c.n_head,
        ") and model.d_model (", c.d_model, "): each rank holds n_head / ", tp,
        " heads and 4 d_model / ", tp, " MLP units"));
  }
  if (sequence_parallel && c.context % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.enable_sequence_parallel needs model.context (", c.context,
        ") to divide by parallelism.tensor_parallel_degree = ", tp,
        ": each rank holds context / ", tp, " positions of every sequence"));
  }
  return absl::OkStatus();
}

bool TpReplicated(const std::string& name) { return SplitOf(name).parts == 0; }

bool SequencePartial(const std::string& name) {
  return absl::StartsWith(name, "blocks.") && TpReplicated(name);
}

std::vector<int64_t> TpLocalShape(const std::string& name, const std::vector<int64_t>& shape,
                                  int size) {
  std::vector<int64_t> local = shape;
  if (TpReplicated(name)) return local;
  local[FlatInputMajor(name) ? 1 : 0] /= size;
  return local;
}

std::vector<std::pair<int64_t, int64_t>> TpRanges(const std::string& name,
                                                   const std::vector<int64_t>& shape, int rank,
                                                   int size) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const TpSplit split = SplitOf(name);
  if (split.parts == 0) return {{0, numel}};
  // Rows of the canonical order: output rows, or (input-major) input columns.
  const int64_t rows = FlatInputMajor(name) ? shape[1] : shape[0];
  const int64_t row = numel / rows, per_part = rows / split.parts, mine = per_part / size;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int part = 0; part < split.parts; ++part) {
    ranges.emplace_back((part * per_part + rank * mine) * row, mine * row);
  }
  return ranges;
}

torch::Tensor TpLocalPart(const std::string& name, const torch::Tensor& whole, int rank,
                          int size) {
  const auto flat = CanonicalFlat(name, whole);
  std::vector<torch::Tensor> pieces;
  for (const auto& [offset, count] : TpRanges(name, whole.sizes().vec(), rank, size)) {
    pieces.push_back(flat.narrow(0, offset, count));
  }
  return ShapedView(name, torch::cat(pieces), TpLocalShape(name, whole.sizes().vec(), size))
      .clone();
}

namespace {

// Dropout of the residual stream. Under sequence parallelism a rank holds a slice of the sequence
// and applies that slice of the mask the whole sequence draws: the same draws as without it
// (dropout's own: one Bernoulli per element of the whole shape, scaled by 1 / (1 - p)), and the
// ranks' generators stay in step.
torch::Tensor ResidualDropout(const torch::Tensor& x, double p, bool training,
                              TensorParallel* tp) {
  if (tp == nullptr || !tp->sequence_parallel() || !training || p == 0) {
    return F::dropout(x, F::DropoutFuncOptions().p(p).training(training));
  }
  const int64_t slice = x.size(1);
  auto noise = torch::empty({x.size(0), slice * tp->size(), x.size(2)}, x.options());
  noise.bernoulli_(1 - p).div_(1 - p);
  return x * noise.narrow(1, tp->rank() * slice, slice);
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& c, TensorParallel* tp)
    : n_head_(c.n_head / SizeOr1(tp)), dropout_(c.dropout), tp_(tp) {
  const int64_t local = c.d_model / SizeOr1(tp);
  qkv_ = register_module("qkv", torch::nn::Linear(c.d_model, 3 * local));
  proj_ = register_module("proj", torch::nn::Linear(local, c.d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  auto qkv = tp_ != nullptr ? tp_->ColumnParallel(x, qkv_->weight, qkv_->bias) : qkv_->forward(x);
  const int64_t b = qkv.size(0), t = qkv.size(1), local = proj_->weight.size(1);
  qkv = qkv.view({b, t, 3, n_head_, local / n_head_}).permute({2, 0, 3, 1, 4});
  auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]);
  y = y.transpose(1, 2).contiguous().view({b, t, local});
  auto out = tp_ != nullptr ? tp_->RowParallel(y, proj_->weight, proj_->bias) : proj_->forward(y);
  return ResidualDropout(out, dropout_, is_training(), tp_);
}

MlpImpl::MlpImpl(const ModelConfig& c, TensorParallel* tp) : tp_(tp) {
  const int64_t hidden = 4 * c.d_model / SizeOr1(tp);
  fc_ = register_module("fc", torch::nn::Linear(c.d_model, hidden));
  proj_ = register_module("proj", torch::nn::Linear(hidden, c.d_model));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  if (tp_ == nullptr) return proj_->forward(torch::gelu(fc_->forward(x), "tanh"));
  auto h = torch::gelu(tp_->ColumnParallel(x, fc_->weight, fc_->bias), "tanh");
  return tp_->RowParallel(h, proj_->weight, proj_->bias);
}

BlockImpl::BlockImpl(const ModelConfig& c, TensorParallel* tp) : dropout_(c.dropout), tp_(tp) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn_ = register_module("attn", CausalSelfAttention(c, tp));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  mlp_ = register_module("mlp", Mlp(c, tp));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn_->forward(ln1_->forward(x));
  auto m = mlp_->forward(ln2_->forward(x));
  return x + ResidualDropout(m, dropout_, is_training(), tp_);
}

GptImpl::GptImpl(const ModelConfig& c, TensorParallel* tp) : config_(c), tp_(tp) {
  tok_emb_ = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.d_model));
  pos_emb_ = register_module("pos_emb", torch::nn::Embedding(c.context, c.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < c.n_layer; ++i) blocks_->push_back(Block(c, tp));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  head_ = register_module("head", torch::nn::Linear(
                                      torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));

  // Deterministic init, independent of the global generator and of registration side effects:
  // each whole parameter in turn (the same draws at any tensor-parallel degree), then this rank's
  // part of it.
  torch::NoGradGuard no_grad;
  auto gen = compat::MakeCpuGenerator(c.init_seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  const auto shapes = ParameterShapes(c);
  const auto params = NamedParameters(*this);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    auto whole = torch::empty(shapes[i].second, p.options());
    if (absl::EndsWith(name, ".bias")) {
      whole.zero_();
    } else if (absl::StartsWith(name, "ln") || absl::StrContains(name, ".ln")) {
      whole.fill_(1.0);
    } else if (FlatInputMajor(name)) {
      whole.normal_(0.0, residual_std, gen);
    } else {
      whole.normal_(0.0, 0.02, gen);
    }
    p.copy_(tp == nullptr ? whole : TpLocalPart(name, whole, tp->rank(), tp->size()));
  }
}

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  auto pos = torch::arange(t, tokens.options().dtype(torch::kLong));
  auto x = tok_emb_->forward(tokens) + pos_emb_->forward(pos);
  x = F::dropout(x, F::DropoutFuncOptions().p(config_.dropout).training(is_training()));
  return tp_ != nullptr ? tp_->Split(x) : x;
}

torch::Tensor GptImpl::RunBlock(int i, const torch::Tensor& x) {
  return blocks_[size_t(i)]->as<Block>()->forward(x);
}

torch::Tensor GptImpl::Logits(const torch::Tensor& x) {
  return head_->forward(ln_f_->forward(tp_ != nullptr ? tp_->Join(x) : x));
}

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
