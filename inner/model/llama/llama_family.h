// Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases): its family
// row and the rules of its settings. Torch-free; the modules are inner/model/llama/llama.h.
#ifndef ATOLL_INNER_MODEL_LLAMA_LLAMA_FAMILY_H_
#define ATOLL_INNER_MODEL_LLAMA_LLAMA_FAMILY_H_

#include "inner/model/family.h"

namespace atl::inner::llama {

extern const ModelFamily kFamily;

// The module (inner/model/llama/llama.cc).
CausalLm Build(const ModelConfig& config);

// Key/value heads: model.n_kv_head, or n_head when it is 0.
int KvHeads(const ModelConfig& config);
// The SwiGLU width: model.ffn_hidden, or Llama's rule round_up(2/3 * 4 * d_model, ffn_multiple_of).
int FfnHidden(const ModelConfig& config);

}  // namespace atl::inner::llama

#endif  // ATOLL_INNER_MODEL_LLAMA_LLAMA_FAMILY_H_
