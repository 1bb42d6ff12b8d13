// A model's weights in and out of atoll: read from any of atoll's sources (the global model of a
// coordinator's durable state, an island's or the baseline's checkpoint, a safetensors file) and
// written as safetensors that other tools load.
//
// Safetensors names: `--names hf` (the default; "gpt2" is its old name) writes the Hugging Face
// names and layouts of the model's family (its HfMapping, inner/model/hf_mapping.h), `--names
// atoll` atoll's own names and shapes. The metadata carries the model config ("atoll.model",
// JSON) and the source.
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

// kHf: Hugging Face's names of the model's family.
enum class NameStyle { kHf, kAtoll };
absl::StatusOr<NameStyle> ParseNameStyle(const std::string& name);

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

// An error naming the first field (arch, the family's settings, n_layer, d_model, n_head,
// context, vocab) that differs.
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
