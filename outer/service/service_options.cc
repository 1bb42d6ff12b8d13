#include "outer/service/service_options.h"

namespace atl::outer {

SyncServerOptions ServiceOptions(const OuterConfig& outer, const RunBudget& run, int shard) {
  SyncServerOptions o;
  o.run_id = outer.run_id;
  o.optimizer = outer.optimizer;
  o.min_islands = outer.min_islands;
  o.round_timeout_s = outer.round_timeout_s;
  o.grace = outer.grace;
  o.lease_s = outer.lease_s;
  o.sync_every = uint32_t(outer.sync_every);
  o.total_inner_steps = run.total_inner_steps;
  o.phases = outer.phases;
  o.num_data_streams = uint32_t(outer.islands);
  o.config_hash = run.config_hash;
  o.codec = outer.wire_codec();
  o.aggregation.rule = outer.aggregation;
  o.aggregation.clip_multiple = outer.clip_multiple;
  o.aggregation.trim_fraction = outer.trim_fraction;
  o.max_update_norm = outer.max_update_norm;
  o.max_update_value = outer.max_update_value;
  o.service_threads = outer.service_threads;
  o.num_shards = uint32_t(outer.shards);
  o.shard = shard;
  if (outer.auto_tune) {
    o.auto_tune_target = outer.target_utilization;
    o.auto_tune_headroom = outer.auto_tune_headroom;
  }
  o.tokens_per_step = run.tokens_per_step;
  // outer.max_staleness -1: the mode's default (sync 1 round, async 16 versions).
  o.sync_max_staleness = outer.max_staleness < 0 ? 1 : uint32_t(outer.max_staleness);
  if (outer.async()) {
    o.async = true;
    o.max_staleness = outer.max_staleness < 0 ? 16 : uint32_t(outer.max_staleness);
    o.staleness_scaling = outer.staleness_scaling;
    o.optimizer.momentum_delay = outer.momentum_delay > 0 ? outer.momentum_delay : outer.islands;
  }
  if (outer.async() || outer.run_end == RunEnd::kTokens) {
    o.dynamic_local_steps = outer.dynamic_local_steps;
    // The token budget of the run: T inner steps on each of the M islands.
    o.token_budget = run.total_inner_steps * uint64_t(outer.islands) * run.tokens_per_step;
  }
  return o;
}

}  // namespace atl::outer
