// The [model] section: which model to build (torch-free, so that config tools need no libtorch).
#ifndef ATOLL_INNER_MODEL_CONFIG_H_
#define ATOLL_INNER_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace atl::inner {

struct ModelConfig {
  static constexpr const char* kSection = "model";
  // The model family, a row of the family table (inner/model/family.h): "gpt2" (LayerNorm,
  // learned positions, GELU MLP, biases) or "llama" (RMSNorm, rotary positions, SwiGLU MLP,
  // grouped-query attention, no biases).
  std::string arch = "gpt2";
  int n_layer = 4;
  int d_model = 128;
  int n_head = 4;
  int context = 128;  // tokens per sequence
  int vocab = 256;    // 256 = byte-level text
  double dropout = 0.0;
  uint64_t init_seed = 1337;
  // Families' own settings: the [model] section declares their keys; the family that reads
  // them owns their rules, validation and part in the model's identity (its FamilySetting rows).
  // Llama's (inner/model/llama/llama_family.h):
  int n_kv_head = 0;      // key/value heads (grouped-query attention); 0: n_head
  int ffn_hidden = 0;     // SwiGLU width; 0: the Llama rule (llama::FfnHidden)
  int ffn_multiple_of = 256;  // the rule rounds up to a multiple of this
  double norm_eps = 1e-5;     // RMSNorm's epsilon
  double rope_theta = 10000;  // rotary embeddings' base
  bool tie_embeddings = false;  // the head reuses the token embedding matrix
};

template <class V>
void VisitKeys(ModelConfig& c, V&& v) {
  v("arch", c.arch, "model family, a row of inner/model/families.cc: \"gpt2\" or \"llama\"");
  v("n_layer", c.n_layer, "transformer blocks");
  v("d_model", c.d_model, "residual stream width");
  v("n_head", c.n_head, "attention heads (divides d_model)");
  v("context", c.context, "tokens per training sequence");
  v("vocab", c.vocab, "vocabulary size (256 for byte-level text)");
  v("dropout", c.dropout, "dropout probability");
  v("init_seed", c.init_seed, "seed of the parameter initialization");
  v("n_kv_head", c.n_kv_head, "llama: key/value heads, dividing n_head (0: n_head)");
  v("ffn_hidden", c.ffn_hidden, "llama: SwiGLU hidden width (0: round_up(8 d_model / 3, ffn_multiple_of))");
  v("ffn_multiple_of", c.ffn_multiple_of, "llama: what the default SwiGLU width rounds up to");
  v("norm_eps", c.norm_eps, "llama: RMSNorm epsilon");
  v("rope_theta", c.rope_theta, "llama: rotary position embedding base");
  v("tie_embeddings", c.tie_embeddings, "llama: the LM head shares the token embedding matrix");
}

// Names the first offending field; OK when the model can be built (the family's own checks
// included).
absl::Status Validate(const ModelConfig& config);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_CONFIG_H_
