#include "inner/model_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"

namespace atl::inner {
namespace {

constexpr EnumName<ModelArch> kArchs[] = {{ModelArch::kGpt2, "gpt2"}, {ModelArch::kLlama, "llama"}};

absl::Status Positive(const char* key, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be positive, got ", value));
}

// The keys only the Llama family reads, refused elsewhere rather than ignored.
absl::Status ValidateLlamaKeys(const ModelConfig& c) {
  if (c.arch != ModelArch::kLlama) {
    if (c.n_kv_head != 0 || c.ffn_hidden != 0 || c.tie_embeddings) {
      return absl::InvalidArgumentError(
          "model.n_kv_head, model.ffn_hidden and model.tie_embeddings apply to model.arch = "
          "\"llama\" only");
    }
    return absl::OkStatus();
  }
  if (c.n_kv_head < 0 || c.n_head % c.kv_heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.n_kv_head (", c.n_kv_head,
                                                   ") must divide model.n_head (", c.n_head,
                                                   "): each key/value head serves n_head / "
                                                   "n_kv_head query heads"));
  }
  if ((c.d_model / c.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.d_model / model.n_head (", c.d_model / c.n_head,
        ") must be even: rotary embeddings turn pairs of each head's dimensions"));
  }
  if (c.ffn_hidden < 0 || c.ffn_multiple_of < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.ffn_hidden must be >= 0 and model.ffn_multiple_of positive, got ", c.ffn_hidden,
        " and ", c.ffn_multiple_of));
  }
  if (!(c.norm_eps > 0 && c.norm_eps < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("model.norm_eps must be in (0, 1), got ", c.norm_eps));
  }
  if (!(c.rope_theta > 1)) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_theta must be above 1, got ", c.rope_theta));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseConfigValue(const std::string& text, ModelArch* value) {
  return ParseEnumValue(text, kArchs, value);
}

std::string ConfigValueText(ModelArch value) { return EnumValueName(value, kArchs); }

int ModelConfig::FfnHidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  const int64_t rule = 8 * int64_t(d_model) / 3;
  const int64_t m = std::max(1, ffn_multiple_of);
  return int((rule + m - 1) / m * m);
}

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
  return ValidateLlamaKeys(c);
}

}  // namespace atl::inner
