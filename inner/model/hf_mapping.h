// A family's Hugging Face mapping (torchtitan's state-dict adapter): its names there, which of its
// tensors are stored transposed, its config.json both ways, and what else its files may hold.
// src/store/hf_format.cc reads and writes the directories through it and knows no family.
// Torch-free.
#ifndef ATOLL_INNER_MODEL_HF_MAPPING_H_
#define ATOLL_INNER_MODEL_HF_MAPPING_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "inner/model_config.h"
#include "nlohmann/json.hpp"

namespace atl::inner {

struct HfMapping {
  // config.json's "architectures" (the first is written; all are read) and "model_type".
  absl::Span<const char* const> architectures;
  const char* model_type;
  // A tensor only this family's Hugging Face files hold (it tells a safetensors file's names).
  const char* marker;
  // The Hugging Face name of an atoll parameter, and whether it is stored transposed there.
  std::string (*name)(const std::string& atoll_name, bool* transposed);
  // config.json's model keys (torch_dtype, use_cache and token ids are the writer's).
  nlohmann::json (*config)(const ModelConfig&);
  // The model a config.json describes, refusing by key what the family cannot be.
  absl::StatusOr<ModelConfig> (*model_of)(const nlohmann::json& config, const std::string& path);
  // A stored tensor that is not a parameter and may be skipped (rotary or mask buffers).
  bool (*is_buffer)(const std::string& stored_name);
  // A parameter other tools' files may omit, tied to another stored tensor ("head.weight" read
  // from "transformer.wte.weight"); null when none.
  const char* omittable;
  const char* omitted_from;
  // A stored tensor that may duplicate the first parameter (a tied head written anyway), checked
  // by value; null when none or when the model is not tied.
  const char* (*tied_copy)(const ModelConfig&);
};

// config.json's values, each refused by key when it is not what the model can be.
namespace hf_json {
// An integer in [1, 2^30] (required, or `fallback` when absent and a fallback is given).
absl::StatusOr<int> Int(const nlohmann::json& j, const char* key, const std::string& path,
                        std::optional<int> fallback = std::nullopt);
absl::StatusOr<double> Number(const nlohmann::json& j, const char* key, const std::string& path,
                              double fallback);
// `key`, when present, must equal `want`.
absl::Status Expect(const nlohmann::json& j, const char* key, const nlohmann::json& want,
                    const std::string& path);
absl::Status Bad(const std::string& path, const std::string& why);
}  // namespace hf_json

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_HF_MAPPING_H_
