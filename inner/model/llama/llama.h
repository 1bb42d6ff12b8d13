// The Llama family (Llama 2/3, Mistral-style): token embeddings, pre-RMSNorm blocks of
// grouped-query causal self-attention with rotary position embeddings (Hugging Face's rotate-half
// layout: each head's dimension i turns with dimension i + head_dim / 2) and a SwiGLU MLP
// (down(silu(gate(x)) * up(x))), final RMSNorm, an LM head (or the embedding matrix, tied); no
// biases. Parameter names follow Hugging Face's LlamaForCausalLM without its "model." prefix
// ("layers.3.self_attn.q_proj.weight", "embed_tokens.weight", "norm.weight", "lm_head.weight").
// Its plan: q_proj, k_proj, v_proj, gate_proj and up_proj column-parallel, o_proj and down_proj
// row-parallel (a rank holds n_head / tp query heads and n_kv_head / tp key/value heads); the
// embeddings, the norms and the head whole on every rank.
#ifndef ATOLL_INNER_MODEL_LLAMA_LLAMA_H_
#define ATOLL_INNER_MODEL_LLAMA_LLAMA_H_

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>

#include "inner/model/causal_lm.h"
#include "inner/model/llama/llama_family.h"

namespace atl::inner::llama {

// x * rsqrt(mean(x^2) + eps) * weight over the last dimension, computed in fp32 and returned in
// x's type (as Hugging Face's LlamaRMSNorm).
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

// Rotary position embeddings of q or k [B, heads, T, head_dim] at positions 0..T-1 (offset by
// `start`): x * cos + rotate_half(x) * sin, with angle pos / theta^(2i / head_dim) for i < head_dim / 2
// shared by dimensions i and i + head_dim / 2.
torch::Tensor ApplyRotary(const torch::Tensor& x, double theta, int64_t start = 0);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  // x's positions from `start` on; their keys and values (the key/value heads') join the cache.
  torch::Tensor Decode(const torch::Tensor& x, int64_t start, torch::Tensor& keys,
                       torch::Tensor& values);
  void set_sequence_style(SequenceStyle* style) { style_ = style; }

 private:
  int64_t head_dim_;
  double theta_, dropout_;
  SequenceStyle* style_ = nullptr;
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  Linear gate_{nullptr}, up_{nullptr}, down_{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  torch::Tensor forward(torch::Tensor x);
  torch::Tensor Decode(torch::Tensor x, int64_t start, torch::Tensor& keys, torch::Tensor& values);
  void set_sequence_style(SequenceStyle* style);

 private:
  double dropout_;
  SequenceStyle* style_ = nullptr;
  RmsNorm input_norm_{nullptr}, post_attention_norm_{nullptr};
  Attention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

class LlamaImpl : public CausalLmImpl {
 public:
  // Initializes deterministically from config.init_seed on the CPU: N(0, 0.02) for the
  // embeddings and projections, the residual projections (o_proj, down_proj) scaled by
  // 1/sqrt(2 * n_layer), unit norm gains.
  explicit LlamaImpl(const ModelConfig& config);

  torch::Tensor Embed(const torch::Tensor& tokens) override;
  torch::Tensor RunBlock(int i, const torch::Tensor& x) override;
  torch::Tensor Logits(const torch::Tensor& x) override;
  void SetSequenceStyle(std::shared_ptr<SequenceStyle> style) override;
  torch::Tensor Decode(const torch::Tensor& tokens, KvCache& cache) override;

 private:
  std::shared_ptr<SequenceStyle> style_;
  torch::nn::Embedding embed_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  RmsNorm norm_{nullptr};
  Linear head_{nullptr};  // none when tied
};

}  // namespace atl::inner::llama

#endif  // ATOLL_INNER_MODEL_LLAMA_LLAMA_H_
