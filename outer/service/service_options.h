// The outer-sync service's options from the run's [outer] section: what the service decides for
// every island (H, the phases, the mode, the run's steps and token budget, aggregation, bounds),
// built in one place for every process that hosts it (`atoll coordinator`, shard servers, tests).
#ifndef ATOLL_OUTER_SERVICE_SERVICE_OPTIONS_H_
#define ATOLL_OUTER_SERVICE_SERVICE_OPTIONS_H_

#include <cstdint>

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

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SERVICE_OPTIONS_H_
