// Island checkpoints: one file per checkpoint under RUN_DIR/checkpoints/, written to a temporary
// file, fsynced and renamed, so a reader sees either the old or the new checkpoint, never half of
// one. Every tensor carries an XXH64 checksum; a damaged file is refused, never half-loaded.
#ifndef ATOLL_SRC_CHECKPOINT_H_
#define ATOLL_SRC_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/trainer.h"

namespace atl {

struct CheckpointMeta {
  double wall_s = 0;        // training wall time so far
  std::string config_toml;  // resolved config of the run
};

struct Checkpoint {
  inner::TrainerState state;
  CheckpointMeta meta;
};

absl::Status WriteCheckpoint(const std::string& path, const inner::TrainerState& state,
                             const CheckpointMeta& meta);
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// RUN_DIR/checkpoints/step-00000200.ckpt
std::string CheckpointPath(const std::string& run_dir, int64_t step);
// The newest checkpoint of a run directory; NOT_FOUND when it has none.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& run_dir);
// Removes all but the newest `keep` checkpoints.
void PruneCheckpoints(const std::string& run_dir, int keep);

// Writes `contents` to `path` atomically (temp file in the same directory, fsync, rename, fsync of
// the directory).
absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);

}  // namespace atl

#endif  // ATOLL_SRC_CHECKPOINT_H_
