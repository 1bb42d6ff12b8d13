// The outer-sync service's options from the run's [outer] section: what the service decides for
// every island (H, the phases, the mode, the run's steps and token budget, aggregation, bounds),
// built in one place for every process that hosts it (`atoll coordinator`, shard servers, tests).
#ifndef ATOLL_OUTER_SERVICE_SERVICE_OPTIONS_H_
#define ATOLL_OUTER_SERVICE_SERVICE_OPTIONS_H_

#include <cstdint>
#include <string>

#include "outer/base/outer_config.h"
#include "outer/service/sync_server.h"

namespace atl::outer {

// What the service needs to know of the run besides its [outer] section.
struct RunBudget {
  uint64_t total_inner_steps = 0;  // train.steps
  uint64_t tokens_per_step = 0;    // of one data-parallel rank's inner step (batch x accum x context)
  uint64_t config_hash = 0;        // of the model config: islands of another model are refused
};

// `shard`: SyncServerOptions::kControlPlane (the coordinator of a sharded service, or the whole
// service when outer.shards = 1), or shard server K.
SyncServerOptions ServiceOptions(const OuterConfig& outer, const RunBudget& run,
                                 int shard = SyncServerOptions::kControlPlane);

// The cores this process may use: those of its CPU affinity, at most its cgroup's CPU quota
// (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us), rounded up; 1 to 256.
int UsableCores();
// The quota's cores from a cgroup v2 cpu.max text ("max 100000", "150000 100000": 2), at most
// `cores`; `cores` when there is no quota or the text is not one.
int CoresFromCpuMax(const std::string& cpu_max, int cores);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SERVICE_OPTIONS_H_
