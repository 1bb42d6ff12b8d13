#include "inner/model/llama/llama.h"

#include <torch/nn/functional/dropout.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "inner/model.h"
#include "inner/torch_compat.h"

namespace atl::inner::llama {
namespace {

namespace F = torch::nn::functional;

Linear Projection(int64_t in, int64_t out) {
  return Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

CausalLm Build(const ModelConfig& c) { return std::make_shared<LlamaImpl>(c); }

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto h = x.to(torch::kFloat);
  const auto normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

torch::Tensor ApplyRotary(const torch::Tensor& x, double theta, int64_t start) {
  const int64_t t = x.size(2), hd = x.size(3);
  const auto f32 = x.options().dtype(torch::kFloat);
  const auto inv_freq =
      1.0 / torch::pow(theta, torch::arange(0, hd, 2, f32) / double(hd));  // [hd / 2]
  const auto angles = torch::outer(torch::arange(start, start + t, f32), inv_freq);
  const auto both = torch::cat({angles, angles}, -1);  // [T, hd]: dimension i and i + hd / 2
  const auto cos = both.cos().to(x.scalar_type()), sin = both.sin().to(x.scalar_type());
  const auto halves = x.chunk(2, -1);
  const auto rotated = torch::cat({-halves[1], halves[0]}, -1);
  return x * cos + rotated * sin;
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : head_dim_(c.d_model / c.n_head), theta_(c.rope_theta), dropout_(c.dropout) {
  const int64_t kv = int64_t(KvHeads(c)) * head_dim_;
  q_ = register_module("q_proj", Projection(c.d_model, c.d_model));
  k_ = register_module("k_proj", Projection(c.d_model, kv));
  v_ = register_module("v_proj", Projection(c.d_model, kv));
  o_ = register_module("o_proj", Projection(c.d_model, c.d_model));
}

// The heads of this rank: all of them, or its part under tensor parallelism (its query heads and
// the key/value heads they share, consecutive in both).
torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  torch::Tensor keys, values;  // no cache: the whole sequence at once
  return ResidualDropout(Decode(x, 0, keys, values), dropout_, is_training(), style_);
}

torch::Tensor AttentionImpl::Decode(const torch::Tensor& x, int64_t start, torch::Tensor& keys,
                                    torch::Tensor& values) {
  auto heads = [&](const torch::Tensor& y) {
    return y.view({y.size(0), y.size(1), y.size(2) / head_dim_, head_dim_}).transpose(1, 2);
  };
  auto q = ApplyRotary(heads(q_->forward(x)), theta_, start);
  auto k = ApplyRotary(heads(k_->forward(x)), theta_, start);
  auto v = heads(v_->forward(x));
  keys = keys.defined() ? torch::cat({keys, k}, 2) : k;
  values = values.defined() ? torch::cat({values, v}, 2) : v;
  k = keys;
  v = values;
  // Grouped-query attention: query head h reads key/value head h / (heads per key/value head).
  if (const int64_t rep = q.size(1) / k.size(1); rep > 1) {
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
  }
  auto y = compat::CachedAttention(q, k, v);
  const int64_t b = y.size(0), t = y.size(2);
  return o_->forward(y.transpose(1, 2).contiguous().view({b, t, y.size(1) * head_dim_}));
}

MlpImpl::MlpImpl(const ModelConfig& c) {
  const int64_t f = FfnHidden(c);
  gate_ = register_module("gate_proj", Projection(c.d_model, f));
  up_ = register_module("up_proj", Projection(c.d_model, f));
  down_ = register_module("down_proj", Projection(f, c.d_model));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return down_->forward(torch::silu(gate_->forward(x)) * up_->forward(x));
}

BlockImpl::BlockImpl(const ModelConfig& c) : dropout_(c.dropout) {
  input_norm_ = register_module("input_layernorm", RmsNorm(c.d_model, c.norm_eps));
  attn_ = register_module("self_attn", Attention(c));
  post_attention_norm_ = register_module("post_attention_layernorm", RmsNorm(c.d_model, c.norm_eps));
  mlp_ = register_module("mlp", Mlp(c));
}

void BlockImpl::set_sequence_style(SequenceStyle* style) {
  style_ = style;
  attn_->set_sequence_style(style);
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn_->forward(input_norm_->forward(x));
  auto m = mlp_->forward(post_attention_norm_->forward(x));
  return x + ResidualDropout(m, dropout_, is_training(), style_);
}

torch::Tensor BlockImpl::Decode(torch::Tensor x, int64_t start, torch::Tensor& keys,
                                torch::Tensor& values) {
  x = x + attn_->Decode(input_norm_->forward(x), start, keys, values);
  return x + mlp_->forward(post_attention_norm_->forward(x));
}

LlamaImpl::LlamaImpl(const ModelConfig& c) : CausalLmImpl(c) {
  embed_ = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.d_model));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int i = 0; i < c.n_layer; ++i) layers_->push_back(Block(c));
  norm_ = register_module("norm", RmsNorm(c.d_model, c.norm_eps));
  if (!c.tie_embeddings) head_ = register_module("lm_head", Projection(c.d_model, c.vocab));

  InitializeParameters(*this, kFamily.plan(c));
}

torch::Tensor LlamaImpl::Embed(const torch::Tensor& tokens) {
  auto x = embed_->forward(tokens);
  x = F::dropout(x, F::DropoutFuncOptions().p(config().dropout).training(is_training()));
  return style_ ? style_->Split(x) : x;
}

torch::Tensor LlamaImpl::RunBlock(int i, const torch::Tensor& x) {
  return layers_[size_t(i)]->as<Block>()->forward(x);
}

torch::Tensor LlamaImpl::Logits(const torch::Tensor& x) {
  auto h = norm_->forward(style_ ? style_->Join(x) : x);
  return head_ ? head_->forward(h) : torch::matmul(h, embed_->weight.t());
}

torch::Tensor LlamaImpl::Decode(const torch::Tensor& tokens, KvCache& cache) {
  auto x = embed_->forward(tokens);
  cache.keys.resize(size_t(num_blocks()));
  cache.values.resize(size_t(num_blocks()));
  for (int i = 0; i < num_blocks(); ++i) {
    x = layers_[size_t(i)]->as<Block>()->Decode(x, cache.length, cache.keys[size_t(i)],
                                                cache.values[size_t(i)]);
  }
  cache.length += tokens.size(1);
  return Logits(x);
}

void LlamaImpl::SetSequenceStyle(std::shared_ptr<SequenceStyle> style) {
  style_ = std::move(style);
  for (int i = 0; i < num_blocks(); ++i) layers_[size_t(i)]->as<Block>()->set_sequence_style(style_.get());
}

}  // namespace atl::inner::llama
