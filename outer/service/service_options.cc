#include "outer/service/service_options.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

namespace atl::outer {
namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

}  // namespace

int CoresFromCpuMax(const std::string& cpu_max, int cores) {
  std::istringstream in(cpu_max);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || !(period > 0)) return cores;
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || !(q > 0)) return cores;
  return std::clamp(int(std::ceil(q / period)), 1, cores);
}

int UsableCores() {
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  const std::string v2 = ReadSmallFile("/sys/fs/cgroup/cpu.max");
  if (!v2.empty()) {
    cores = CoresFromCpuMax(v2, cores);
  } else {  // cgroup v1: the quota and period in two files (-1: none)
    const std::string quota = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    const std::string period = ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!quota.empty() && !period.empty() && quota.rfind("-1", 0) != 0) {
      cores = CoresFromCpuMax(quota + " " + period, cores);
    }
  }
  return std::clamp(cores, 1, 256);
}

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
  o.moment_sync_every = uint32_t(outer.moment_sync_every);
  o.num_data_streams = uint32_t(outer.islands);
  o.config_hash = run.config_hash;
  o.codec = outer.wire_codec();
  o.aggregation.rule = outer.aggregation;
  o.aggregation.clip_multiple = outer.clip_multiple;
  o.aggregation.trim_fraction = outer.trim_fraction;
  o.aggregation.copies.overlap = outer.copy_overlap;
  o.aggregation.copies.cosine = outer.copy_cosine;
  o.scoring.loss_probe = outer.scoring == "loss_probe";
  o.scoring.decay = outer.reputation_decay;
  o.scoring.floor = outer.reputation_floor;
  o.scoring.exclude_below = outer.exclude_below;
  o.scoring.exclude_rounds = uint32_t(outer.exclude_rounds);
  o.scoring.leave_one_out_t = outer.leave_one_out_t;
  o.scoring.step_guard = outer.step_guard;
  o.max_update_norm = outer.max_update_norm;
  o.max_update_value = outer.max_update_value;
  o.service_threads = outer.service_threads > 0 ? outer.service_threads : UsableCores();
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
