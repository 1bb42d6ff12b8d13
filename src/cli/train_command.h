// `atoll train`: one island trains alone (also the centralized baseline of comparisons).
#ifndef ATOLL_SRC_CLI_TRAIN_COMMAND_H_
#define ATOLL_SRC_CLI_TRAIN_COMMAND_H_

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "inner/trainer.h"
#include "src/config/config.h"

namespace atl {

struct TrainOptions {
  std::string run_dir;
  bool resume = false;  // continue from the newest checkpoint in run_dir
  FILE* progress = stderr;
  bool tty = false;                            // updating progress line
  const std::atomic<bool>* stop = nullptr;     // set (e.g. by SIGINT): checkpoint and stop
  int64_t stop_after_step = 0;                 // > 0: checkpoint and stop after this step
};

struct TrainSummary {
  int64_t step = 0;
  int64_t tokens = 0;
  double wall_s = 0;
  double tokens_per_s = 0;  // this invocation only
  std::optional<inner::EvalStats> last_eval;
  bool stopped = false;  // ended early on request
};

// Validates the data and the run directory before writing anything; then trains to
// config.train.steps, writing RUN_DIR/config.toml, metrics.jsonl and checkpoints.
absl::StatusOr<TrainSummary> Train(const Config& config, const TrainOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_TRAIN_COMMAND_H_
