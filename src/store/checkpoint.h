// Checkpoints of a trainer: RUN_DIR/checkpoints/step-NNNNNNNN/ holds one file per rank
// (rank-RRRRR-of-WWWWW.ckpt: the parameter and AdamW slices that rank owns, with the step, data
// cursor and RNG) and manifest.json (written by rank 0). Every file is written to a temporary file,
// fsynced and renamed; a checkpoint counts once its manifest and every rank's file are there, so a
// reader sees the old or the new checkpoint, never half of one. Every tensor carries an XXH64
// checksum; a damaged file is refused, never half-loaded. Reading merges the ranks' slices, and a
// trainer takes what it owns from them, so a checkpoint written by N ranks resumes on M.
#ifndef ATOLL_SRC_STORE_CHECKPOINT_H_
#define ATOLL_SRC_STORE_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/trainer.h"
#include "src/store/atomic_file.h"  // WriteFileAtomic, for the files around checkpoints

namespace atl {

struct CheckpointMeta {
  double wall_s = 0;        // training wall time so far
  std::string config_toml;  // resolved config of the run
};

struct Checkpoint {
  inner::TrainerState state;
  CheckpointMeta meta;
};

// One file holding `state` (a rank's part of a checkpoint, or a whole one).
absl::Status WriteCheckpoint(const std::string& path, const inner::TrainerState& state,
                             const CheckpointMeta& meta);
// Rank `rank` of `world` writes its file into the checkpoint directory `dir`; rank 0 also writes
// the manifest.
absl::Status WriteCheckpointShard(const std::string& dir, int rank, int world,
                                  const inner::TrainerState& state, const CheckpointMeta& meta);
// A checkpoint directory (every rank's slices merged) or a single file.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// RUN_DIR/checkpoints/step-00000200
std::string CheckpointPath(const std::string& run_dir, int64_t step);
// The newest complete checkpoint of a run directory; NOT_FOUND when it has none.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& run_dir);
// Removes all but the newest `keep` checkpoints.
void PruneCheckpoints(const std::string& run_dir, int keep);

}  // namespace atl

#endif  // ATOLL_SRC_STORE_CHECKPOINT_H_
