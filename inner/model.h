// GPT-2-style decoder: token + position embeddings, pre-LayerNorm blocks of causal self-attention
// and a GELU MLP, final LayerNorm, untied LM head. Parameter names are stable API: fragments of the
// outer sync and checkpoints are defined by them ("blocks.3.attn.qkv.weight").
#ifndef ATOLL_INNER_MODEL_H_
#define ATOLL_INNER_MODEL_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "inner/model_config.h"

namespace atl::inner {

// Every parameter's name and shape in registration order, by closed form (tools that map or check
// weights need them without building the module).
std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(const ModelConfig& config);

// The parameters in model order by closed form, each block's grouped under "blocks.<l>.*"
// (planning needs their sizes, not the module): embeddings, blocks, final LayerNorm, head.
std::vector<std::pair<std::string, int64_t>> ParameterGroups(const ModelConfig& config);

// Their sum (tests check the module against it).
int64_t ParameterCount(const ModelConfig& config);

// The canonical flat order of each parameter, shared by the outer sync, checkpoints and the
// service's state: row-major, except for the weights of the row-parallel projections
// (attn.proj.weight, mlp.proj.weight), which flatten input-major (as their transposes do). Then
// the part of any parameter that a tensor-parallel rank holds is at most three ranges (the q, k
// and v parts of attn.qkv), whatever the degree (inner/parallel/tensor_parallel.h).
bool FlatInputMajor(const std::string& name);
// `flat` (1-D, in canonical order) seen as the parameter of `shape` (a view).
torch::Tensor ShapedView(const std::string& name, const torch::Tensor& flat,
                         torch::IntArrayRef shape);
// The parameter in canonical order (1-D; a copy when its memory is in another order).
torch::Tensor CanonicalFlat(const std::string& name, const torch::Tensor& param);

// Forward FLOPs per token (6N rule plus attention), for isoflop accounting and utilization.
double TrainFlopsPerToken(const ModelConfig& config);

// Tensor parallelism, Megatron style: a rank of `size` holds n_head / size heads of each
// attention (column-parallel qkv: its rows of the q, k and v parts; row-parallel proj: its input
// columns) and 4 d_model / size hidden units of each MLP (column-parallel fc, row-parallel proj);
// everything else (embeddings, LayerNorms, the biases of the row-parallel projections, the head)
// is whole on every rank: the vocabulary is bytes (256 rows), too small to be worth splitting.
// One all-reduce per attention and per MLP in forward (the row-parallel output) and one each in
// backward (the column-parallel input's gradient). The collectives come from
// inner/parallel/tensor_parallel; the model only calls them.
//
// Sequence parallelism (Korthikanti et al.) on top: between the blocks' tensor-parallel regions
// each rank holds its 1/size slice of the sequence (dimension 1 of [B, T, d_model]), so the
// LayerNorms, the dropouts and the residual stream compute and keep 1/size of the activations.
// A column-parallel layer then all-gathers its input's sequence (reduce-scatters the gradient)
// and keeps only the slice for backward, where it gathers it again; a row-parallel layer
// reduce-scatters its output (gathers the gradient): the same bytes as the all-reduces, plus one
// all-gather per column-parallel layer in backward. The embeddings run whole and Split keeps the
// rank's slice; Join gathers it back before the final LayerNorm and the head, which run whole.
// The LayerNorms and row-parallel biases of the blocks see a slice each: their gradients are
// partial sums, added over the ranks once per step (inner/parallel/fsdp).
class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual bool sequence_parallel() const = 0;
  // x W^T + b with this rank's output rows of W and b, for an input every rank holds (its
  // gradient summed over the ranks) or, sequence-parallel, the ranks' slices of it.
  virtual torch::Tensor ColumnParallel(const torch::Tensor& x, const torch::Tensor& weight,
                                       const torch::Tensor& bias) = 0;
  // The ranks' partial products y W^T (this rank's input columns of W) summed, then b (whole)
  // added; sequence-parallel, the rank's slice of the sum.
  virtual torch::Tensor RowParallel(const torch::Tensor& y, const torch::Tensor& weight,
                                    const torch::Tensor& bias) = 0;
  // Sequence-parallel only (identity otherwise): the rank's slice of a tensor every rank holds
  // whole (gathered backward), and the whole of a sliced one (sliced backward).
  virtual torch::Tensor Split(const torch::Tensor& x) = 0;
  virtual torch::Tensor Join(const torch::Tensor& x) = 0;
};

// Names what keeps the model from splitting over `tp` tensor-parallel ranks (n_head and d_model
// must divide by it; with sequence parallelism, model.context too).
absl::Status ValidateTensorParallel(const ModelConfig& config, int tp,
                                    bool sequence_parallel = false);
// Whether the parameter is whole on every tensor-parallel rank but, under sequence parallelism,
// sees the rank's slice of the sequence only (the blocks' LayerNorms and row-parallel biases).
bool SequencePartial(const std::string& name);
// Whether every tensor-parallel rank holds the whole parameter.
bool TpReplicated(const std::string& name);
// The shape of a parameter (whole: `shape`) on a rank of `size`.
std::vector<int64_t> TpLocalShape(const std::string& name, const std::vector<int64_t>& shape,
                                  int size);
// The ranges (offset, count) of the parameter's canonical flat order that rank `rank` of `size`
// holds, in the order of its own part's canonical flat order (at most three).
std::vector<std::pair<int64_t, int64_t>> TpRanges(const std::string& name,
                                                   const std::vector<int64_t>& shape, int rank,
                                                   int size);
// Rank `rank`'s part of the whole parameter `whole` (a copy, of TpLocalShape).
torch::Tensor TpLocalPart(const std::string& name, const torch::Tensor& whole, int rank, int size);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const ModelConfig& config, TensorParallel* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int n_head_;  // on this rank
  double dropout_;
  TensorParallel* tp_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config, TensorParallel* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  TensorParallel* tp_;
  torch::nn::Linear fc_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config, TensorParallel* tp = nullptr);
  torch::Tensor forward(torch::Tensor x);

 private:
  double dropout_;
  TensorParallel* tp_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // Initializes deterministically from config.init_seed (GPT-2 scheme: N(0, 0.02), residual
  // projections scaled by 1/sqrt(2 * n_layer), zero biases, unit LayerNorm gains) on the CPU.
  // With `tp` (which must outlive the module), this rank's part of the model: each parameter is
  // its part of the whole one that one rank initializes, whatever the degree.
  explicit GptImpl(const ModelConfig& config, TensorParallel* tp = nullptr);

  // tokens: [B, T] int64 with T <= context. Returns logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  // The pieces of forward, for training unit by unit (inner/parallel/fsdp): token + position
  // embeddings (with dropout), block i, and the final norm with the head. Under sequence
  // parallelism Embed returns, and blocks take and return, the rank's slice of the sequence.
  torch::Tensor Embed(const torch::Tensor& tokens);
  torch::Tensor RunBlock(int i, const torch::Tensor& x);
  torch::Tensor Logits(const torch::Tensor& x);
  // Mean next-token cross-entropy (nats).
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  TensorParallel* tp_;
  torch::nn::Embedding tok_emb_{nullptr}, pos_emb_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

// Parameters in registration order with their stable names.
std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(torch::nn::Module& module);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_H_
