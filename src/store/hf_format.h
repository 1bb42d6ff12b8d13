// Hugging Face checkpoints, both ways: a directory that `transformers`' from_pretrained loads as
// is (config.json, model.safetensors or shards with model.safetensors.index.json,
// generation_config.json), and such a directory, from atoll or from other tools, read back.
//
// Names, layouts and config.json keys are each family's (its HfMapping, inner/model/hf_mapping.h:
// GPT2LMHeadModel in inner/model/gpt/gpt_family.cc, LlamaForCausalLM in
// inner/model/llama/llama_family.cc); this file reads and writes the directories through them.
#ifndef ATOLL_SRC_STORE_HF_FORMAT_H_
#define ATOLL_SRC_STORE_HF_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "inner/model_config.h"
#include "nlohmann/json.hpp"
#include "src/store/model_io.h"

namespace atl::hf {

// The Hugging Face name of an atoll parameter of `model`'s family, and whether it is stored
// transposed there.
std::string Name(const inner::ModelConfig& model, const std::string& atoll_name, bool* transposed);

// config.json for `model` (torch_dtype "bfloat16" or "float32").
nlohmann::json Config(const inner::ModelConfig& model, bool bf16);
// The model a config.json describes; refuses, by key, what atoll's families cannot be (an
// architecture no family maps, or what the family's mapping refuses).
absl::StatusOr<inner::ModelConfig> ModelOf(const nlohmann::json& config, const std::string& path);

struct ExportOptions {
  bool bf16 = false;                        // BF16 tensors, rounded to nearest even; else F32
  uint64_t max_shard_bytes = 5'000'000'000;  // past this, shards and an index (Hugging Face's 5GB)
  // The run's SentencePiece model, copied as tokenizer.model with tokenizer_config.json and
  // special_tokens_map.json (LlamaTokenizer); its special ids go into config.json and
  // generation_config.json. Empty: a byte-level model, no tokenizer files.
  std::string tokenizer;
  int bos_id = -1, eos_id = -1, unk_id = -1;  // -1: the tokenizer has none
};
// Writes the directory `dir` (created; must not hold a config.json already). Returns the files
// written, in order.
absl::StatusOr<std::vector<std::string>> Write(const ModelWeights& weights, const std::string& dir,
                                               const ExportOptions& options);

// Whether `dir` looks like such a directory (a config.json beside model.safetensors or its index).
bool IsDirectory(const std::string& dir);
// Reads one: every parameter of the model its config.json describes, under the names above, from
// one file or the shards its index names; shapes checked by name; a tensor the model does not
// have is refused (except the family's buffers, and a tied model's copy of its embeddings).
absl::StatusOr<ModelWeights> Load(const std::string& dir);

}  // namespace atl::hf

#endif  // ATOLL_SRC_STORE_HF_FORMAT_H_
