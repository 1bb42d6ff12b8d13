// The GPT-2 family: token and position embeddings, pre-LayerNorm blocks of causal self-attention
// and a GELU MLP, final LayerNorm, untied LM head. Parameter names are stable API
// ("blocks.3.attn.qkv.weight"). Its plan: attn.qkv (q, k, v alike) and mlp.fc column-parallel,
// attn.proj and mlp.proj row-parallel; the embeddings, the LayerNorms and the head whole on every
// rank (the vocabulary is bytes, too small to be worth splitting). With tensor parallelism one
// all-reduce per attention and per MLP forward (the row-parallel outputs) and one each backward.
#ifndef ATOLL_INNER_MODEL_GPT_GPT_H_
#define ATOLL_INNER_MODEL_GPT_GPT_H_

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include "inner/model/causal_lm.h"
#include "inner/model/gpt/gpt_family.h"

namespace atl::inner::gpt {

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  // x's positions after the cached ones; their keys and values join the cache.
  torch::Tensor Decode(const torch::Tensor& x, torch::Tensor& keys, torch::Tensor& values);
  void set_sequence_style(SequenceStyle* style) { style_ = style; }

 private:
  int64_t head_dim_;
  double dropout_;
  SequenceStyle* style_ = nullptr;
  Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Linear fc_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(torch::Tensor x);
  torch::Tensor Decode(torch::Tensor x, torch::Tensor& keys, torch::Tensor& values);
  void set_sequence_style(SequenceStyle* style);

 private:
  double dropout_;
  SequenceStyle* style_ = nullptr;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public CausalLmImpl {
 public:
  // Initializes deterministically from config.init_seed (GPT-2 scheme: N(0, 0.02), residual
  // projections scaled by 1/sqrt(2 * n_layer), zero biases, unit LayerNorm gains) on the CPU.
  explicit GptImpl(const ModelConfig& config);

  torch::Tensor Embed(const torch::Tensor& tokens) override;
  torch::Tensor RunBlock(int i, const torch::Tensor& x) override;
  torch::Tensor Logits(const torch::Tensor& x) override;
  void SetSequenceStyle(std::shared_ptr<SequenceStyle> style) override;
  torch::Tensor Decode(const torch::Tensor& tokens, KvCache& cache) override;

 private:
  std::shared_ptr<SequenceStyle> style_;
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  Linear head_{nullptr};
};

}  // namespace atl::inner::gpt

#endif  // ATOLL_INNER_MODEL_GPT_GPT_H_
