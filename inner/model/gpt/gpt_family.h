// GPT-2 (LayerNorm, learned positions, tanh-GELU MLP, biases): its family row. Torch-free; the
// modules are inner/model/gpt/gpt.h.
#ifndef ATOLL_INNER_MODEL_GPT_GPT_FAMILY_H_
#define ATOLL_INNER_MODEL_GPT_GPT_FAMILY_H_

#include "inner/model/family.h"

namespace atl::inner::gpt {

extern const ModelFamily kFamily;

// The module (inner/model/gpt/gpt.cc).
CausalLm Build(const ModelConfig& config);

}  // namespace atl::inner::gpt

#endif  // ATOLL_INNER_MODEL_GPT_GPT_FAMILY_H_
