// One island of a DiLoCo run: joins the service through any outer::Transport, trains its inner
// steps on its own data stream and runs an outer round every H steps. Used by `atoll island` over
// gRPC and by the tests in process.
//
// An island is one process or N ranks (one process each, torchrun-style variables; the island's
// mesh from [parallelism]): every rank runs RunIsland. Rank 0 speaks for the island (join,
// heartbeats, leave, metrics.jsonl, summary.json); every rank pushes, receives and checks the
// ranges it owns; decisions that change what the ranks do next are shared (IslandRanks).
#ifndef ATOLL_SRC_ISLAND_ISLAND_LOOP_H_
#define ATOLL_SRC_ISLAND_ISLAND_LOOP_H_

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "inner/parallel/communicator.h"
#include "inner/trainer.h"
#include "outer/base/transport.h"
#include "outer/island/outer_step.h"
#include "src/config/config.h"

namespace atl {

namespace pb = ::atollpb::v1;

struct IslandOptions {
  std::string name;                       // island name (its id in the run)
  std::string run_dir;                    // metrics.jsonl, config.toml, summary.json
  FILE* progress = stderr;
  bool tty = false;
  const std::atomic<bool>* stop = nullptr;  // leave the run after the current round
  double throttle = 1.0;  // >= 1: every inner step takes this many times as long (heterogeneity)
  bool resume = false;    // continue from the newest checkpoint in run_dir (fresh if none yet)
  inner::parallel::RankInfo rank;  // this process's place in the island (one rank by default)
  double collective_timeout_s = 60;  // every collective inside the island
  // "HOST:PORT" (port 0: any free port) to serve GET /metrics (Prometheus) on; rank r serves on
  // PORT + r. Off when empty.
  std::string metrics_listen;
};

// The island's end: the outer step's figures (rounds, resyncs, rejoins, bytes each way, idle
// time, tau, the link, staleness: outer::OuterStepStats) and the island's own.
struct IslandSummary : outer::OuterStepStats {
  std::string island_id;
  int64_t step = 0;
  int64_t tokens = 0;
  uint64_t spikes = 0;    // steps the loss-spike guard refused (local parameters reloaded)
  uint64_t stuck_reloads = 0;  // of them, reloads of global parameters reloaded before, unchanged
  uint64_t checkpoints = 0;
  int64_t steps_trained = 0;  // inner steps this process ran (the step counter may jump on a join)
  double checkpoint_stall_max_s = 0;  // longest pause of training to snapshot a checkpoint
  double wall_s = 0;
  double compute_s = 0;   // inner steps
  uint64_t global_hash = 0;  // ParamsHash of the final global parameters this rank holds
  // Each fragment's (this rank's ranges of it): with one rank, the coordinator's per-fragment
  // hashes ("stopped after N rounds, global params ...").
  std::vector<uint64_t> fragment_hashes;
  bool whole_fragments = true;  // one rank: fragment_hashes cover whole fragments
  std::string global_copy = "host";  // where its pseudo-gradients were made (outer.global_copy)
  std::optional<inner::EvalStats> last_eval;
};

absl::StatusOr<IslandSummary> RunIsland(const Config& config, outer::Transport& transport,
                                        const IslandOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_ISLAND_ISLAND_LOOP_H_
