// A model's weights in and out of atoll: read from any of atoll's sources (the global model of a
// coordinator's durable state, an island's or the baseline's checkpoint, a safetensors file) and
// written as safetensors that other tools load.
//
// Safetensors names (`--names gpt2`, the default) follow Hugging Face's GPT-2, whose architecture
// atoll's model is (pre-LayerNorm blocks, tanh GELU, LayerNorm eps 1e-5, learned positions):
//   tok_emb.weight                -> transformer.wte.weight
//   pos_emb.weight                -> transformer.wpe.weight
//   blocks.L.ln1.{weight,bias}    -> transformer.h.L.ln_1.{weight,bias}   (ln2 -> ln_2)
//   blocks.L.attn.qkv.weight      -> transformer.h.L.attn.c_attn.weight   transposed [d, 3d]
//   blocks.L.attn.proj.weight     -> transformer.h.L.attn.c_proj.weight   transposed
//   blocks.L.mlp.fc.weight        -> transformer.h.L.mlp.c_fc.weight      transposed [d, 4d]
//   blocks.L.mlp.proj.weight      -> transformer.h.L.mlp.c_proj.weight    transposed [4d, d]
//   (biases keep their shape)     -> the same names with .bias
//   ln_f.{weight,bias}            -> transformer.ln_f.{weight,bias}
//   head.weight                   -> lm_head.weight  (atoll's head is untied from wte)
// GPT-2's Conv1D stores weights [in, out], hence the transposes. `--names atoll` writes atoll's own
// names and shapes. The metadata carries the model config ("atoll.model", JSON) and the source.
#ifndef ATOLL_SRC_STORE_MODEL_IO_H_
#define ATOLL_SRC_STORE_MODEL_IO_H_

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/model.h"
#include "inner/trainer.h"
#include "src/config/config.h"

namespace atl {

// kHf: Hugging Face's names of the model's family (GPT-2's below; Llama's in src/store/hf_format.h).
enum class NameStyle { kHf, kAtoll };
absl::StatusOr<NameStyle> ParseNameStyle(const std::string& name);

// The GPT-2 name of an atoll parameter, and whether its tensor is stored transposed there.
std::string Gpt2Name(const std::string& atoll_name, bool* transposed);

struct ModelWeights {
  inner::ModelConfig model;
  // Every parameter in atoll's names and model order: fp32, CPU, full shapes.
  std::vector<std::pair<std::string, at::Tensor>> params;
  // What they are, for metadata and messages: "source", "kind" (global / checkpoint / file),
  // "run_id", "round" or "step"; "tokenizer", the SentencePiece model the run trained with (a
  // Hugging Face directory's tokenizer.model, or data.tokenizer of the run's config).
  std::map<std::string, std::string> facts;
};

// Reads the weights of `source`:
//  - a coordinator's run directory or its service-state.pb: the global model (the run's
//    config.toml next to it, else `config`, says how its fragments map to parameters);
//  - the run directory of `atoll local` / `atoll compare`: its coordinator's global model;
//  - an island's or `atoll train`'s run directory (newest checkpoint), a checkpoint directory or
//    file: that replica's parameters (the checkpoint carries its config);
//  - a safetensors file in either name style. Its model config comes from its metadata, else from
//    its shapes with n_head from `config` (shapes do not show the heads).
// Values must be finite. `config` may be null.
absl::StatusOr<ModelWeights> LoadWeights(const std::string& source, const Config* config);

// The fields that make a model's architecture (every tensor's shape follows from them).
using ArchitectureField = std::pair<const char*, int inner::ModelConfig::*>;
const std::vector<ArchitectureField>& ArchitectureFields();

// Sets `to`'s architecture (every field that shapes a tensor or the forward) to `from`'s.
void CopyArchitecture(const inner::ModelConfig& from, inner::ModelConfig& to);

// An error naming the first field (arch, Llama's keys, n_layer, d_model, n_head, context, vocab)
// that differs.
absl::Status CheckSameArchitecture(const inner::ModelConfig& want, const inner::ModelConfig& got,
                                   const std::string& what);

// Writes `weights` as F32 safetensors, atomically; `extra` joins the metadata.
absl::Status WriteSafetensors(const ModelWeights& weights, const std::string& path, NameStyle style,
                              const std::map<std::string, std::string>& extra = {});

// The run's starting weights (config.train.init_from), checked against config.model.
absl::StatusOr<ModelWeights> InitialWeights(const Config& config);

// Copies `weights` into a module's parameters by name, all checked first (all or nothing).
absl::Status CopyInto(const ModelWeights& weights,
                      const std::vector<std::pair<std::string, at::Tensor>>& params);
// The same into the model slices of a trainer's exported state (any sharding).
absl::Status CopyInto(const ModelWeights& weights, inner::TrainerState& state);

}  // namespace atl

#endif  // ATOLL_SRC_STORE_MODEL_IO_H_
