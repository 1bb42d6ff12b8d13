// `atoll loadtest`: the outer-sync service under the load of a big model and many islands, without
// training. A real coordinator process (with --shards K, and K shard server processes) serves
// synthetic islands (threads of this process, each with
// its own gRPC connection) that join, heartbeat, push random pseudo-gradients of the model's size
// chunk by chunk, and receive every round's update, as islands do. Reports commit time, the
// service's peak memory, heartbeat latency while rounds commit, and goodput.
#ifndef ATOLL_SRC_CLI_LOADTEST_COMMAND_H_
#define ATOLL_SRC_CLI_LOADTEST_COMMAND_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/config/config.h"

namespace atl {

struct LoadtestOptions {
  int64_t params = 20'000'000;  // the model is sized to about this many parameters
  int islands = 4;
  int rounds = 3;
  int shards = 1;
  std::string run_dir;
  std::string binary;           // the atoll program (the coordinator is started from it)
  std::string config_path;      // optional: the run's config (model dimensions are replaced)
  std::vector<Override> overrides;
  double heartbeat_every_s = 0.05;  // each synthetic island's heartbeat period (latency samples)
  double timeout_s = 1800;          // bound on the whole test
  FILE* out = stdout;
  const std::atomic<bool>* stop = nullptr;
};

struct LoadtestReport {
  int64_t params = 0;
  std::string codec;
  int islands = 0, rounds = 0, shards = 1, service_threads = 0;
  double model_bytes = 0;         // fp32
  double contribution_bytes = 0;  // one island's encoded pseudo-gradient
  // Memory of the processes holding the outer state (the coordinator, or each shard server of a
  // sharded service): resident once listening (the first), peak over the whole test (VmHWM).
  int64_t rss_start = 0;
  int64_t rss_peak = 0;                 // the largest of them
  std::vector<int64_t> shard_rss_peak;  // each
  int64_t coordinator_rss_peak = 0;     // the coordinator's (a sharded service: membership only)
  std::vector<double> push_s, commit_s, round_s;  // per round, as the islands see them
  // Per round, the service's own commit (aggregation, outer step, encoding, hashing; the longest
  // of the round's fragments), from the commit records (rounds.jsonl's commit_s).
  std::vector<double> service_commit_s;
  double heartbeat_p50_ms = 0, heartbeat_p99_ms = 0, heartbeat_max_ms = 0;
  double commit_heartbeat_p99_ms = 0;  // those in flight while a round was being committed
  int heartbeats = 0, commit_heartbeats = 0;
  double push_goodput = 0;   // encoded bytes pushed per second of push phase, all islands
  double round_goodput = 0;  // bytes pushed and received per second of whole rounds
  double wall_s = 0;
};

// Sizes a GPT (256-token vocabulary, head size 64, at least 4 blocks when it can) to about
// `params` parameters.
inner::ModelConfig ModelForParams(int64_t params);

absl::StatusOr<LoadtestReport> RunLoadtest(const LoadtestOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_LOADTEST_COMMAND_H_
