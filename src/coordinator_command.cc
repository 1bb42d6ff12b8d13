#include "src/coordinator_command.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/codec.h"
#include "inner/model.h"
#include "outer/fragments.h"
#include "src/flat_params.h"
#include "src/metrics.h"

namespace atl {

absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeSyncServer(const Config& config) {
  inner::Gpt model(config.model);
  const NamedParams params = inner::NamedParameters(*model);
  outer::SyncServerOptions o;
  o.run_id = config.outer.run_id;
  o.optimizer = config.outer.optimizer;
  o.min_islands = config.outer.min_islands;
  o.round_timeout_s = config.outer.round_timeout_s;
  o.lease_s = config.outer.lease_s;
  o.sync_every = uint32_t(config.outer.sync_every);
  o.total_inner_steps = uint64_t(config.train.steps);
  o.num_data_streams = uint32_t(config.outer.islands);
  o.config_hash = ModelConfigHash(config.model);
  o.codec = *compression::ParseCodec(config.outer.codec);  // validated with the config
  if (config.outer.async()) {
    o.async = true;
    o.max_staleness = uint32_t(config.outer.max_staleness);
    o.staleness_scaling = config.outer.staleness_scaling;
    o.dynamic_local_steps = config.outer.dynamic_local_steps;
    o.optimizer.momentum_delay =
        config.outer.momentum_delay > 0 ? config.outer.momentum_delay : config.outer.islands;
    // The token budget of the run: T inner steps on each of the M islands.
    o.token_budget = uint64_t(config.train.steps) * uint64_t(config.outer.islands) *
                     uint64_t(config.train.batch_size) * uint64_t(config.train.grad_accum) *
                     uint64_t(config.model.context);
  }
  const auto layout = LayoutOf(params);
  auto plan = outer::PlanFragments(layout.names, config.outer.num_fragments,
                                   *outer::ParseFragmentPattern(config.outer.fragment_pattern));
  if (!plan.ok()) return plan.status();
  std::vector<outer::FragmentLayout> layouts;
  std::vector<std::vector<float>> initial;
  for (const auto& indices : plan->parameters) {
    outer::FragmentLayout l;
    for (size_t i : indices) {
      l.names.push_back(layout.names[i]);
      l.numels.push_back(layout.numels[i]);
    }
    layouts.push_back(std::move(l));
    initial.push_back(Flatten(params, indices));
  }
  return std::make_unique<outer::SyncServer>(o, std::move(layouts), std::move(initial));
}

absl::Status RunCoordinator(const Config& config, const CoordinatorOptions& options) {
  auto made = MakeSyncServer(config);
  if (!made.ok()) return made.status();
  auto sync = *std::move(made);
  std::unique_ptr<MetricsLog> rounds_log;
  if (!options.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.run_dir, ec);
    auto log = MetricsLog::Open(options.run_dir + "/rounds.jsonl", -1);
    if (!log.ok()) return log.status();
    rounds_log = *std::move(log);
  }
  // Rounds per fragment: one per due step of the schedule, plus a final one at the last step for
  // fragments that are not due there.
  const outer::SyncSchedule schedule(config.outer.sync_every, config.outer.num_fragments);
  uint64_t total_rounds = 0;
  for (int64_t t = 1; t <= config.train.steps; ++t) total_rounds += schedule.DueAfter(t).size();
  total_rounds += uint64_t(config.outer.num_fragments) - schedule.DueAfter(config.train.steps).size();
  const auto start = std::chrono::steady_clock::now();
  std::atomic<uint64_t> sync_rounds{0};
  sync->SetCommitListener([&](const outer::CommittedRound& r) {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (config.outer.async()) {
      std::fprintf(options.out,
                   "version %llu applied%s: %s, staleness %llu, %llu tokens, params %016llx, %.1fs\n",
                   (unsigned long long)sync_rounds.fetch_add(1) + 1,
                   config.outer.num_fragments > 1
                       ? absl::StrFormat(" (fragment %d, its version %d)", r.fragment, r.round + 1).c_str()
                       : "",
                   absl::StrJoin(r.contributors, "+").c_str(), (unsigned long long)r.staleness,
                   (unsigned long long)r.tokens, (unsigned long long)r.params_hash, wall);
    } else {
    std::fprintf(options.out, "round %llu/%llu committed%s: %s, %llu tokens, params %016llx, %.1fs\n",
                 (unsigned long long)sync_rounds.fetch_add(1) + 1, (unsigned long long)total_rounds,
                 config.outer.num_fragments > 1
                     ? absl::StrFormat(" (fragment %d, its round %d)", r.fragment, r.round + 1).c_str()
                     : "",
                 absl::StrJoin(r.contributors, "+").c_str(), (unsigned long long)r.tokens,
                 (unsigned long long)r.params_hash, wall);
    }
    std::fflush(options.out);
    if (rounds_log) {
      rounds_log->Write({{"round", r.round},
                         {"fragment", r.fragment},
                         {"contributors", r.contributors},
                         {"tokens", r.tokens},
                         {"staleness", r.staleness},
                         {"params_hash", absl::StrFormat("%016x", r.params_hash)},
                         {"wall_s", wall}});
    }
  });
  sync->SetEventListener([&](const std::string& line) {
    std::fprintf(options.out, "%s\n", line.c_str());
    std::fflush(options.out);
  });
  auto server = GrpcServer::Start(sync.get(), options.server);
  if (!server.ok()) return server.status();
  const std::string plan =
      config.outer.async()
          ? absl::StrFormat("async, %d tokens", sync->options().token_budget)
          : absl::StrFormat("%d rounds", total_rounds);
  std::fprintf(options.out, "atoll coordinator: run '%s' listening on %s (%d islands, H = %d, %s)\n",
               config.outer.run_id.c_str(), (*server)->address().c_str(), config.outer.islands,
               config.outer.sync_every, plan.c_str());
  std::fflush(options.out);
  while (options.stop == nullptr || !options.stop->load()) {
    const bool done = config.outer.async() ? sync->budget_reached()
                                           : sync->committed_rounds() >= total_rounds;
    if (done && sync->num_members() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  (*server)->Shutdown();
  std::fprintf(options.out, "atoll coordinator: stopped after %llu rounds, params %016llx\n",
               (unsigned long long)sync->committed_rounds(), (unsigned long long)sync->params_hash());
  std::fflush(options.out);
  return absl::OkStatus();
}

}  // namespace atl
