// `atoll local`: a coordinator and M islands as child processes on loopback, one progress view,
// one run directory. Everything talks real gRPC over TCP, exactly as across machines.
#ifndef ATOLL_SRC_CLI_LOCAL_COMMAND_H_
#define ATOLL_SRC_CLI_LOCAL_COMMAND_H_

#include <atomic>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/cli/chaos.h"

namespace atl {

// A scheduled event of a rehearsal: at the commit of outer round `round` (counted over all
// fragments, as the coordinator prints them), SIGKILL or SIGTERM an island, or start one.
struct LocalEvent {
  // kStop: SIGSTOP to every process of the island, SIGCONT `seconds` later (a paused island).
  enum Kind { kKill, kTerm, kJoin, kStop } kind = kKill;
  std::string island;  // "island1"
  int rank = -1;       // >= 0: that rank of the island (its agent restarts the island)
  uint64_t round = 0;
  double seconds = 0;  // kStop: how long it stays stopped
};

// "island1@round3" or "1@round3" (island1), "island1.0@round3" (rank 0 of island1) for `kind`;
// kStop: "island1@round3:2.5" (seconds stopped).
absl::StatusOr<LocalEvent> ParseLocalEvent(LocalEvent::Kind kind, const std::string& text);

struct LocalOptions {
  int islands = 2;
  int nproc = 1;         // ranks per island
  int max_restarts = 0;  // per island, when one of its ranks fails
  int shards = 1;        // outer.shards: shard servers started beside the coordinator (shard-K)
  std::string config_path;
  std::vector<std::string> overrides;  // "--key=value" arguments passed to every child
  std::vector<double> throttle;        // island i steps throttle[i] times slower (default 1)
  std::vector<LocalEvent> events;      // failures and joins to rehearse
  // --island-set: "--KEY=VALUE" arguments for one island alone (after the common ones), by name.
  std::map<std::string, std::vector<std::string>> island_overrides;
  // --chaos: failures at random times from the first commit until an island finishes, and the
  // goodput under them against `tokens_per_island` (train.steps x tokens per step of one island).
  std::optional<ChaosSpec> chaos;
  uint64_t tokens_per_island = 0;
  std::string run_dir;                 // coordinator/, island0/, ... and a log per process
  // The coordinator's metrics and status page; island i's metrics on the metrics port + 1 + i.
  std::string metrics_listen, http_listen;
  std::string http_token_file;         // passed on to the coordinator
  std::string atoll_binary;            // default: this executable
  FILE* out = stdout;
  const std::atomic<bool>* stop = nullptr;  // Ctrl-C: stop every child
};

struct LocalSummary {
  double wall_s = 0;
  std::vector<std::string> island_dirs;
  std::optional<GoodputReport> goodput;  // with --chaos (also RUN_DIR/chaos.json)
};

// "1,3" -> {1, 3, 1, ...} for `islands` islands; every factor >= 1, at most one per island.
absl::StatusOr<std::vector<double>> ParseThrottles(const std::string& list, int islands);

// Runs to completion; when any child fails, stops the others and returns its error.
absl::StatusOr<LocalSummary> RunLocal(const LocalOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_LOCAL_COMMAND_H_
