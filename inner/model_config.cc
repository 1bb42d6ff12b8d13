#include "inner/model_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/model/family.h"

namespace atl::inner {
namespace {

absl::Status Positive(const char* key, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be positive, got ", value));
}

}  // namespace

absl::Status Validate(const ModelConfig& c) {
  for (auto [key, value] : {std::pair<const char*, int64_t>{"model.n_layer", c.n_layer},
                            {"model.d_model", c.d_model},
                            {"model.n_head", c.n_head},
                            {"model.context", c.context},
                            {"model.vocab", c.vocab}}) {
    ATL_RETURN_IF_ERROR(Positive(key, value));
  }
  if (c.d_model % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d_model (", c.d_model,
                                                   ") must be divisible by model.n_head (",
                                                   c.n_head, ")"));
  }
  if (!(c.dropout >= 0.0 && c.dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dropout must be in [0, 1), got ", c.dropout));
  }
  return ValidateFamily(c);
}

}  // namespace atl::inner
