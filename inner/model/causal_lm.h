// What atoll trains: a decoder-only language model of some family, as a plain module (no
// parallelism in it) with its parallelization plan. The trainer and inner/parallel/ see only this
// interface: the embeddings, block i and the head (the units FSDP shards and pipelines cut), the
// plan, and a sequence style a plan may set.
//
// A family's module implements this interface; its row in the family table (inner/model/family.h)
// says the rest.
#ifndef ATOLL_INNER_MODEL_CAUSAL_LM_H_
#define ATOLL_INNER_MODEL_CAUSAL_LM_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "inner/model/family.h"
#include "inner/model/layers.h"
#include "inner/model/plan.h"
#include "inner/model_config.h"

namespace atl::inner {

// Incremental decoding's state: each block's keys and values of the positions seen so far
// ([B, kv heads, length, head_dim]).
struct KvCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length = 0;
};

class CausalLmImpl : public torch::nn::Module {
 public:
  explicit CausalLmImpl(const ModelConfig& config) : config_(config) {}
  // tokens [B, T] int64 -> the residual stream [B, T, d] (under sequence parallelism the rank's
  // slice of T).
  virtual torch::Tensor Embed(const torch::Tensor& tokens) = 0;
  virtual torch::Tensor RunBlock(int i, const torch::Tensor& x) = 0;
  // The final norm and the head: logits [B, T, vocab] (the whole sequence).
  virtual torch::Tensor Logits(const torch::Tensor& x) = 0;
  // Sequence parallelism's boundaries and dropout (nullptr: none).
  virtual void SetSequenceStyle(std::shared_ptr<SequenceStyle> style) = 0;
  // Generation (a whole model, no dropout): the logits [B, T, vocab] of `tokens` [B, T] placed
  // after the cache's positions, whose keys and values join the cache: one new token costs one
  // position's work. The cache's length plus T must stay within the context.
  virtual torch::Tensor Decode(const torch::Tensor& tokens, KvCache& cache) = 0;

  int num_blocks() const { return config_.n_layer; }
  int64_t hidden_size() const { return config_.d_model; }
  const ModelConfig& config() const { return config_; }

  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean next-token cross-entropy (nats).
  torch::Tensor Loss(const torch::Tensor& tokens, const torch::Tensor& targets);

 private:
  ModelConfig config_;
};

// GPT-2's initialization, which every family here uses: deterministic from config.init_seed and
// independent of the global generator, each whole parameter in turn in registration order (a
// tensor-parallel rank then takes its part of the same values): biases 0, norm gains (the 1-D
// weights) 1, the residual projections (the plan's row-parallel weights) N(0, 0.02 /
// sqrt(2 n_layer)), every other weight N(0, 0.02).
void InitializeParameters(CausalLmImpl& model, const ParallelPlan& plan);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_CAUSAL_LM_H_
