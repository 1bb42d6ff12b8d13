// `atoll plan`: before renting GPUs, what a run's links must carry. For a model (a parameter count
// or a config's model), an inner step time, islands and their links, it replays each method's
// schedule (outer/base/planner.h) and prints, per method, the bytes per island per round and per hour,
// the peak bytes in flight, the compute utilization on the given link and the lowest bandwidth
// that reaches a target utilization; with --svg, utilization against bandwidth per method.
#ifndef ATOLL_SRC_CLI_PLAN_COMMAND_H_
#define ATOLL_SRC_CLI_PLAN_COMMAND_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "outer/base/planner.h"
#include "src/config/config.h"

namespace atl {

struct PlanOptions {
  int64_t params = 0;        // 0: the config's model
  std::string config_path;   // optional: model, islands and [outer] settings
  std::vector<Override> overrides;
  double step_time_s = 0;
  int islands = 0;           // 0: the config's (or 2)
  std::string bandwidth;     // empty: no utilization column (needs --target-utilization then)
  std::string latency = "0";
  int connections = 0;       // 0: the config's outer.connections (or 1)
  double tcp_window_mib = 4;
  std::string method;        // empty: the ladder of Table 4 (data parallel ... streaming + codec)
  int sync_every = 0, fragments = 0, tau = -1;  // 0 / -1: the config's, else 100 / 8 / 1
  std::string codec;         // empty: the config's (the ladder's last row: fp4_e2m1)
  std::string topology = "star";
  double target = 0;         // 0: none
  int64_t steps = 0;         // 0: steady state; else a finite run, ending synced
  double commit_ns_per_param = 2.1;
  int service_threads = 0;   // 0: the config's outer.service_threads (or 1)
  int shards = 0;            // 0: the config's outer.shards (or 1)
  double commit_parallel_fraction = 0.76;
  std::string service_bandwidth;  // the service's own link, each way (empty: unlimited)
  std::string svg;           // optional: utilization vs bandwidth per method
  bool json = false;         // one JSON object per row instead of the table
  FILE* out = stdout;
};

absl::Status RunPlan(const PlanOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_PLAN_COMMAND_H_
