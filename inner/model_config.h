// The [model] section: which model to build (torch-free, so that config tools need no libtorch).
#ifndef ATOLL_INNER_MODEL_CONFIG_H_
#define ATOLL_INNER_MODEL_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace atl::inner {

struct ModelConfig {
  static constexpr const char* kSection = "model";
  int n_layer = 4;
  int d_model = 128;
  int n_head = 4;
  int context = 128;  // tokens per sequence
  int vocab = 256;    // 256 = byte-level text
  double dropout = 0.0;
  uint64_t init_seed = 1337;
};

template <class V>
void VisitKeys(ModelConfig& c, V&& v) {
  v("n_layer", c.n_layer, "transformer blocks");
  v("d_model", c.d_model, "residual stream width");
  v("n_head", c.n_head, "attention heads (divides d_model)");
  v("context", c.context, "tokens per training sequence");
  v("vocab", c.vocab, "vocabulary size (256 for byte-level text)");
  v("dropout", c.dropout, "dropout probability");
  v("init_seed", c.init_seed, "seed of the parameter initialization");
}

// Names the first offending field; OK when the model can be built.
absl::Status Validate(const ModelConfig& config);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_CONFIG_H_
