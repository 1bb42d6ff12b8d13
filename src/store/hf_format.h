// Hugging Face checkpoints, both ways: a directory that `transformers`' from_pretrained loads as
// is (config.json, model.safetensors or shards with model.safetensors.index.json,
// generation_config.json), and such a directory, from atoll or from other tools, read back.
//
// Names and layouts (atoll -> Hugging Face):
//   gpt2 (GPT2LMHeadModel): see Gpt2Name (src/store/model_io.h): transformer.* names, the
//     Conv1D weights transposed, lm_head.weight (atoll's head is its own: tie_word_embeddings
//     false);
//   llama (LlamaForCausalLM): "model." + atoll's name (atoll's Llama names are Hugging Face's
//     without that prefix: model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
//     model.norm.weight), except lm_head.weight (none when tied); every tensor in the same
//     layout ([out, in] weights), rotary embeddings in the same rotate-half convention, so no
//     permutation of q_proj / k_proj.
// config.json keys: LlamaConfig's hidden_size, intermediate_size, num_attention_heads,
// num_key_value_heads, num_hidden_layers, rms_norm_eps, rope_theta, max_position_embeddings,
// vocab_size, tie_word_embeddings, hidden_act ("silu"), attention_bias / mlp_bias (false); GPT2Config's
// n_embd, n_head, n_layer, n_positions, vocab_size, layer_norm_epsilon, activation_function.
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
// architecture other than LlamaForCausalLM / GPT2LMHeadModel, rope_scaling, biases, another
// activation, a head_dim that is not hidden_size / num_attention_heads).
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
// have is refused (except rotary inv_freq buffers and GPT-2's attention masks; a tied Llama's
// lm_head.weight when it equals the embeddings).
absl::StatusOr<ModelWeights> Load(const std::string& dir);

}  // namespace atl::hf

#endif  // ATOLL_SRC_STORE_HF_FORMAT_H_
