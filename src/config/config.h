// Run configuration: TOML files with presets under deploy/configs/, every key overridable from the
// command line as --section.key=value (torchtitan style). One schema lists every key with its type
// and meaning; unknown keys, wrong types and out-of-range values are errors that name the key.
#ifndef ATOLL_SRC_CONFIG_CONFIG_H_
#define ATOLL_SRC_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/data.h"
#include "inner/model.h"
#include "inner/parallel/mesh.h"
#include "inner/trainer.h"
#include "outer/outer_config.h"

namespace atl {

struct RunConfig {
  int64_t log_every = 10;         // progress / metrics cadence in steps (non-TTY progress lines)
  int64_t checkpoint_every = 0;   // 0: only at the end (and on Ctrl-C)
  int checkpoint_keep = 2;        // newest checkpoints kept in RUN_DIR/checkpoints
  // The parameters the run starts from instead of model.init_seed's: a safetensors file, an atoll
  // checkpoint or a run directory (src/store/model_io.h). Read by whoever initializes the global model
  // (the coordinator, `atoll train`); islands fetch it from the service.
  std::string init_from;
};

struct CompareConfig {
  std::string methods = "baseline,diloco";  // `atoll compare` rows, comma-separated
};

struct Config {
  inner::ModelConfig model;
  inner::DataConfig data;
  inner::TrainConfig train;
  inner::OptimConfig optim;
  RunConfig run;
  inner::parallel::ParallelismConfig parallelism;  // the mesh of an island's ranks
  outer::OuterConfig outer;
  CompareConfig compare;
};

// One command-line override: key "train.steps", value "200".
using Override = std::pair<std::string, std::string>;

// Parses "--key=value" and "--key value" arguments. Anything else is an error naming it.
absl::StatusOr<std::vector<Override>> ParseOverrides(const std::vector<std::string>& args);

// Defaults, then the TOML file (if `path` is not empty), then the overrides; then validation.
absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<Override>& overrides);

// The same from TOML text (a checkpoint's resolved config); `source` names it in errors.
absl::StatusOr<Config> ParseConfig(const std::string& toml_text, const std::string& source,
                                   const std::vector<Override>& overrides = {});

// The fully resolved configuration as TOML (every key, written into run directories/checkpoints).
std::string ToToml(const Config& config);

// Every key with its documentation, for `atoll config --help`-style listings.
std::vector<std::pair<std::string, std::string>> DescribeKeys();

}  // namespace atl

#endif  // ATOLL_SRC_CONFIG_CONFIG_H_
