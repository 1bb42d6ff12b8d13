// Run configuration: TOML files with presets under deploy/configs/, every key overridable from the
// command line as --section.key=value (torchtitan style). Each component owns its section (the
// struct, its keys with their documentation, its typed values and its validation: inner/*_config.h,
// inner/parallel/parallelism_config.h, outer/base/outer_config.h); this file composes them, one TOML
// section onto one struct. Unknown keys, wrong types and out-of-range values are errors that name
// the key; typed values (codecs, enums) are parsed once, here.
#ifndef ATOLL_SRC_CONFIG_CONFIG_H_
#define ATOLL_SRC_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/data.h"
#include "inner/trainer_config.h"
#include "outer/base/outer_config.h"

namespace atl {

// The [compare] section: `atoll compare`'s rows.
struct CompareConfig {
  static constexpr const char* kSection = "compare";
  std::string methods = "baseline,diloco";  // comma-separated
};

template <class V>
void VisitKeys(CompareConfig& c, V&& v) {
  v("methods", c.methods,
    "`atoll compare` rows: baseline, diloco, diloco_<codec>, streaming_<codec>, sparse_<codec>, "
    "async");
}

struct Config {
  inner::ModelConfig model;
  inner::DataConfig data;
  inner::TrainConfig train;
  inner::OptimConfig optim;
  inner::ActivationCheckpointConfig activation_checkpoint;
  inner::parallel::ParallelismConfig parallelism;  // the mesh of an island's ranks
  outer::OuterConfig outer;
  CompareConfig compare;

  // The sections a trainer is made from.
  inner::TrainerConfig trainer() const {
    return {model, optim, train, activation_checkpoint, parallelism};
  }
  // The tokens one data-parallel rank trains per inner step (batch x accumulation x context).
  uint64_t tokens_per_rank_step() const {
    return uint64_t(train.batch_size) * uint64_t(train.grad_accum) * uint64_t(model.context);
  }
};

// One command-line override: key "train.steps", value "200".
using Override = std::pair<std::string, std::string>;

// Parses "--key=value" and "--key value" arguments. Anything else is an error naming it.
absl::StatusOr<std::vector<Override>> ParseOverrides(const std::vector<std::string>& args);

// What a load checks: every key and how they fit together (Validate), or each key alone (its
// type and spelling): the template of `atoll compare`'s runs, which each method changes before its
// run's whole config is checked.
enum class ConfigChecks { kAll, kKeys };

// Defaults, then the TOML file (if `path` is not empty), then the overrides; then validation.
absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<Override>& overrides,
                                  ConfigChecks checks = ConfigChecks::kAll);

// The same from TOML text (a checkpoint's resolved config); `source` names it in errors.
absl::StatusOr<Config> ParseConfig(const std::string& toml_text, const std::string& source,
                                   const std::vector<Override>& overrides = {});

// Every section checked, alone and against each other (LoadConfig does it; a command that edits
// a loaded config, e.g. `atoll compare` for each of its runs, checks the result again).
absl::Status Validate(const Config& config);

// The fully resolved configuration as TOML (every key, written into run directories/checkpoints).
std::string ToToml(const Config& config);

// Every key with its documentation, for `atoll config --help`-style listings.
std::vector<std::pair<std::string, std::string>> DescribeKeys();

}  // namespace atl

#endif  // ATOLL_SRC_CONFIG_CONFIG_H_
