// The model family table: everything atoll needs of an architecture, one row per family, asked by
// the rest of the code (the trainer, checkpoints, the model's hash and file metadata, Hugging Face
// directories, descriptions), which never names a family. A family owns its files: its modules
// (built from inner/model/layers.h), its settings, its parameter shapes, its parallelization plan,
// its FLOP rule, its checkpoint names and its Hugging Face mapping. Adding one: its files plus a
// row in the table (inner/model/families.cc), or RegisterFamily for a family defined elsewhere (a
// test's). Torch-free: the family's module is built on the torch side (inner/model.h:
// BuildModel, RegisterModule), so the table links without libtorch.
#ifndef ATOLL_INNER_MODEL_FAMILY_H_
#define ATOLL_INNER_MODEL_FAMILY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "inner/model/plan.h"
#include "inner/model_config.h"

namespace atl::inner {

class CausalLmImpl;
using CausalLm = std::shared_ptr<CausalLmImpl>;
struct HfMapping;  // inner/model/hf_mapping.h

using ParamShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// A [model] key that some families read beyond the shared ones (n_layer, d_model, n_head,
// context, vocab, dropout, init_seed). The family's settings are part of what the model is: they
// go into its hash, its files' metadata and the check that two configs build the same model, by
// value as the family reads it (defaults resolved: Llama's n_kv_head 0 is n_head).
struct FamilySetting {
  enum class Kind { kInt, kNumber, kBool };
  const char* key;  // model.<key>
  Kind kind;
  double (*value)(const ModelConfig&);  // as the family reads it
  double (*raw)(const ModelConfig&);    // as the config writes it
  void (*set)(ModelConfig&, double);    // sets the key (to a value or a raw value alike)
  // Other families refuse the key unless it has its default (rather than ignore it).
  bool exclusive;
};

// The tensors of a file, by atoll name (shape or null), for a family that can tell its model
// from them.
using ShapeLookup = std::function<const std::vector<int64_t>*(const std::string& atoll_name)>;

struct ModelFamily {
  const char* name;   // model.arch
  const char* title;  // in descriptions: "GPT", "Llama"
  // Every parameter's name and shape in registration order, by closed form.
  ParamShapes (*shapes)(const ModelConfig&);
  ParallelPlan (*plan)(const ModelConfig&);
  // Training FLOPs per token (forward and backward).
  double (*train_flops_per_token)(const ModelConfig&);
  // What keeps the family's layers from splitting over `tp` (>= 1) ranks, named (OK when they
  // can); the checks every family shares are ValidateTensorParallel's (inner/model.h).
  absl::Status (*validate_tensor_parallel)(const ModelConfig&, int tp);
  // Its own settings, named when out of range (null: none beyond the shared checks).
  absl::Status (*validate)(const ModelConfig&);
  absl::Span<const FamilySetting> settings;
  // The heads as a description says them ("4 heads", "4 heads (2 key/value)").
  std::string (*heads_text)(const ModelConfig&);
  // A file's model from its tensors' shapes alone, over `base` (n_head is not in the shapes);
  // null when the shapes cannot say (the file must carry atoll's metadata or a config.json).
  absl::StatusOr<ModelConfig> (*from_shapes)(const ShapeLookup& find, const ModelConfig& base);
  // Its Hugging Face names and config.json (null: no such format).
  const HfMapping* hf;
};

// The family model.arch names, or null.
const ModelFamily* FindFamily(const std::string& arch);
// The config's family (the default family when the config names none it knows: Validate refuses
// such a config first).
const ModelFamily& FamilyOf(const ModelConfig& config);
// Every family: the table's rows in order (the first is the default model.arch), then the
// registered ones.
std::vector<const ModelFamily*> Families();
// Adds a family defined outside the table (a test's toy family). Its name must be new.
absl::Status RegisterFamily(const ModelFamily* family);

// The family's own checks and the refusal of other families' exclusive keys (inner::Validate
// runs it).
absl::Status ValidateFamily(const ModelConfig& config);

// Whether the config is of the default family, whose files and hash predate model.arch (they
// carry no family name).
bool IsDefaultFamily(const ModelConfig& config);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_FAMILY_H_
