#include "outer/service/service_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "outer/base/names.h"

namespace atl::outer {

std::string ShardName(const SyncServerOptions& o) {
  if (o.num_shards <= 1) return "the service";
  if (o.shard == SyncServerOptions::kControlPlane) return "the coordinator";
  return absl::StrCat("shard ", o.shard, " of ", o.num_shards);
}

ServiceFragment::ServiceFragment(FragmentLayout l, std::vector<float> p,
                                 const OuterOptimizerConfig& o)
    : layout(std::move(l)),
      data_mu(std::make_unique<std::mutex>()),
      data(std::move(p), o),
      params_hash(data.Hash()),
      params_norm(data.Norm()) {}

ServiceCore::ServiceCore(SyncServerOptions o, std::vector<FragmentLayout> layouts,
                         std::vector<std::vector<float>> initial)
    : options(std::move(o)),
      pool(std::make_unique<WorkerPool>(options.service_threads)),
      reputation(options.scoring),
      membership(options.num_data_streams, absl::Seconds(options.lease_s)) {
  for (size_t f = 0; f < layouts.size(); ++f) {
    // A sharded service keeps the data of its own fragments only.
    if (!ShardOwns(options, uint32_t(f))) initial[f] = {};
    fragments.emplace_back(std::move(layouts[f]), std::move(initial[f]), options.optimizer);
  }
  if (is_control_plane()) {
    shard_addresses.resize(options.num_shards);
    end_reports.answered.assign(options.num_shards, absl::InfinitePast());
    end_reports.fresh.assign(options.num_shards, false);
  }
}

absl::StatusOr<uint32_t> ServiceCore::CheckFragment(uint32_t fragment) const {
  if (fragment < fragments.size() && !ShardOwns(options, fragment)) {
    return absl::FailedPreconditionError(
        absl::StrCat("fragment ", fragment, " is served by shard ", fragment % options.num_shards,
                     " of ", options.num_shards, "; this is ", ShardName(options)));
  }
  if (fragment < fragments.size()) return fragment;
  return absl::NotFoundError(absl::StrCat("unknown fragment ", fragment, " (this run has ",
                                          fragments.size(), " fragment",
                                          fragments.size() == 1 ? "" : "s", ")"));
}

absl::Status ServiceCore::CheckRun(const std::string& run_id) const {
  if (run_id == options.run_id) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("unknown run ", Printable(run_id),
                                          " (this service runs '", options.run_id, "')"));
}

void ServiceCore::FillSchedule(pb::OuterSchedule* sched) const {
  sched->set_sync_every(options.sync_every);
  sched->set_num_fragments(uint32_t(fragments.size()));
  sched->set_num_data_streams(options.num_data_streams);
  sched->set_total_inner_steps(options.total_inner_steps);
  sched->set_async(options.async);
  sched->set_token_budget(options.token_budget);
  sched->set_warm_start_steps(uint64_t(options.phases.warm_start_steps));
  sched->set_early_sync_every(uint32_t(options.phases.early_sync_every));
  sched->set_early_sync_steps(uint64_t(options.phases.early_sync_steps));
  sched->set_tokens_per_step(options.tokens_per_step);
  sched->set_moment_sync_every(options.moment_sync_every);
}

void ServiceCore::EventLocked(const std::string& key, const std::string& rest) {
  if (on_event && event_limiter.Allow(key, absl::Now())) on_event(key + rest);
}

int64_t ServiceCore::ResumeFloorLocked() const {
  // An island resumes at a round start of one of the fragments (the latest, or the earliest when
  // they disagree); a shard knows only its own fragments' rounds, which stand within a round of
  // the others': one round back covers them.
  const SyncSchedule schedule = Schedule();
  int64_t floor = INT64_MAX;
  for (uint32_t f = 0; f < fragments.size(); ++f) {
    if (!ShardOwns(options, f)) continue;
    const uint64_t r = fragments[f].round;
    floor = std::min(floor, schedule.RoundStart(int(f), r > 0 ? r - 1 : 0));
  }
  return floor == INT64_MAX ? 0 : floor;
}

bool ServiceCore::AllDoneLocked() const {
  // Async runs, and sync ones that end at their tokens (outer.run_end).
  if (options.async || options.token_budget > 0) {
    return options.token_budget > 0 && tokens_committed >= options.token_budget;
  }
  const uint64_t steps = options.total_inner_steps;
  const uint64_t rounds = fragments[0].round;
  return steps > 0 && rounds > 0 && uint64_t(Schedule().DueStep(0, rounds - 1)) >= steps;
}

}  // namespace atl::outer
