#include "inner/model/gpt/gpt.h"

#include <torch/nn/functional/dropout.h>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "inner/model.h"
#include "inner/torch_compat.h"

namespace atl::inner::gpt {
namespace {

namespace F = torch::nn::functional;

}  // namespace

CausalLm Build(const ModelConfig& c) { return std::make_shared<GptImpl>(c); }

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& c)
    : head_dim_(c.d_model / c.n_head), dropout_(c.dropout) {
  qkv_ = register_module("qkv", Linear(c.d_model, 3 * c.d_model));
  proj_ = register_module("proj", Linear(c.d_model, c.d_model));
}

// The heads of this rank: all of them, or its part under tensor parallelism (qkv's and proj's
// parameters then hold its rows and columns).
torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  auto qkv = qkv_->forward(x);
  const int64_t b = qkv.size(0), t = qkv.size(1), local = proj_->weight.size(1);
  qkv = qkv.view({b, t, 3, local / head_dim_, head_dim_}).permute({2, 0, 3, 1, 4});
  auto y = compat::CausalAttention(qkv[0], qkv[1], qkv[2]);
  y = y.transpose(1, 2).contiguous().view({b, t, local});
  return ResidualDropout(proj_->forward(y), dropout_, is_training(), style_);
}

torch::Tensor CausalSelfAttentionImpl::Decode(const torch::Tensor& x, torch::Tensor& keys,
                                              torch::Tensor& values) {
  auto qkv = qkv_->forward(x);
  const int64_t b = qkv.size(0), t = qkv.size(1), local = proj_->weight.size(1);
  qkv = qkv.view({b, t, 3, local / head_dim_, head_dim_}).permute({2, 0, 3, 1, 4});
  keys = keys.defined() ? torch::cat({keys, qkv[1]}, 2) : qkv[1];
  values = values.defined() ? torch::cat({values, qkv[2]}, 2) : qkv[2];
  auto y = compat::CachedAttention(qkv[0], keys, values);
  return proj_->forward(y.transpose(1, 2).contiguous().view({b, t, local}));
}

MlpImpl::MlpImpl(const ModelConfig& c) {
  fc_ = register_module("fc", Linear(c.d_model, 4 * c.d_model));
  proj_ = register_module("proj", Linear(4 * c.d_model, c.d_model));
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

void BlockImpl::set_sequence_style(SequenceStyle* style) {
  style_ = style;
  attn_->set_sequence_style(style);
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn_->forward(ln1_->forward(x));
  auto m = mlp_->forward(ln2_->forward(x));
  return x + ResidualDropout(m, dropout_, is_training(), style_);
}

torch::Tensor BlockImpl::Decode(torch::Tensor x, torch::Tensor& keys, torch::Tensor& values) {
  x = x + attn_->Decode(ln1_->forward(x), keys, values);
  return x + mlp_->forward(ln2_->forward(x));
}

GptImpl::GptImpl(const ModelConfig& c) : CausalLmImpl(c) {
  tok_emb_ = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.d_model));
  pos_emb_ = register_module("pos_emb", torch::nn::Embedding(c.context, c.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < c.n_layer; ++i) blocks_->push_back(Block(c));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  head_ = register_module("head", Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));

  InitializeParameters(*this, kFamily.plan(c));
}

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  auto pos = torch::arange(t, tokens.options().dtype(torch::kLong));
  auto x = tok_emb_->forward(tokens) + pos_emb_->forward(pos);
  x = F::dropout(x, F::DropoutFuncOptions().p(config().dropout).training(is_training()));
  return style_ ? style_->Split(x) : x;
}

torch::Tensor GptImpl::RunBlock(int i, const torch::Tensor& x) {
  return blocks_[size_t(i)]->as<Block>()->forward(x);
}

torch::Tensor GptImpl::Logits(const torch::Tensor& x) {
  return head_->forward(ln_f_->forward(style_ ? style_->Join(x) : x));
}

torch::Tensor GptImpl::Decode(const torch::Tensor& tokens, KvCache& cache) {
  const int64_t t = tokens.size(1);
  auto pos = torch::arange(cache.length, cache.length + t, tokens.options().dtype(torch::kLong));
  auto x = tok_emb_->forward(tokens) + pos_emb_->forward(pos);
  cache.keys.resize(size_t(num_blocks()));
  cache.values.resize(size_t(num_blocks()));
  for (int i = 0; i < num_blocks(); ++i) {
    x = blocks_[size_t(i)]->as<Block>()->Decode(x, cache.keys[size_t(i)], cache.values[size_t(i)]);
  }
  cache.length += t;
  return head_->forward(ln_f_->forward(x));
}

void GptImpl::SetSequenceStyle(std::shared_ptr<SequenceStyle> style) {
  style_ = std::move(style);
  for (int i = 0; i < num_blocks(); ++i) blocks_[size_t(i)]->as<Block>()->set_sequence_style(style_.get());
}

}  // namespace atl::inner::gpt
