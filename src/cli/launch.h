// `atoll island --nproc N`: starts the N ranks of an island on this machine, like torchrun's
// elastic agent: each rank is `atoll island` again with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
// and MASTER_PORT set. If a rank fails, the agent stops the others (SIGTERM, then SIGKILL after a
// grace period) and, while restarts remain, starts the island again from its newest checkpoint
// (--resume). A stop request (SIGTERM/SIGINT to the agent) reaches every rank.
//
// Multi-node islands are started by the cluster's launcher instead (srun, a Kubernetes indexed
// Job, torchrun): each rank reads the same variables.
#ifndef ATOLL_SRC_CLI_LAUNCH_H_
#define ATOLL_SRC_CLI_LAUNCH_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace atl {

struct LaunchOptions {
  std::string binary;              // this program
  std::vector<std::string> args;   // the island's arguments (without --nproc / --max-restarts)
  int nproc = 1;
  int max_restarts = 0;
  double grace_s = 10;             // after SIGTERM, before SIGKILL
  const std::atomic<bool>* stop = nullptr;
};

// Runs the island's ranks to the end; OK when every rank of the last attempt exited 0.
absl::Status LaunchIsland(const LaunchOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_LAUNCH_H_
