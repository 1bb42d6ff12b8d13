#include "src/coordinator_command.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/codec.h"
#include "inner/model.h"
#include "src/flat_params.h"
#include "src/metrics.h"

namespace atl {

std::unique_ptr<outer::SyncServer> MakeSyncServer(const Config& config) {
  inner::Gpt model(config.model);
  const NamedParams params = inner::NamedParameters(*model);
  outer::SyncServerOptions o;
  o.run_id = config.outer.run_id;
  o.optimizer = config.outer.optimizer;
  o.min_islands = config.outer.min_islands;
  o.round_timeout_s = config.outer.round_timeout_s;
  o.sync_every = uint32_t(config.outer.sync_every);
  o.total_inner_steps = uint64_t(config.train.steps);
  o.num_data_streams = uint32_t(config.outer.islands);
  o.config_hash = ModelConfigHash(config.model);
  o.codec = *compression::ParseCodec(config.outer.codec);  // validated with the config
  return std::make_unique<outer::SyncServer>(o, LayoutOf(params), Flatten(params));
}

absl::Status RunCoordinator(const Config& config, const CoordinatorOptions& options) {
  auto sync = MakeSyncServer(config);
  std::unique_ptr<MetricsLog> rounds_log;
  if (!options.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.run_dir, ec);
    auto log = MetricsLog::Open(options.run_dir + "/rounds.jsonl", -1);
    if (!log.ok()) return log.status();
    rounds_log = *std::move(log);
  }
  const uint64_t total_rounds =
      uint64_t((config.train.steps + config.outer.sync_every - 1) / config.outer.sync_every);
  const auto start = std::chrono::steady_clock::now();
  sync->SetCommitListener([&](const outer::CommittedRound& r) {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(options.out, "round %llu/%llu committed: %s, %llu tokens, params %016llx, %.1fs\n",
                 (unsigned long long)r.round + 1, (unsigned long long)total_rounds,
                 absl::StrJoin(r.contributors, "+").c_str(), (unsigned long long)r.tokens,
                 (unsigned long long)r.params_hash, wall);
    std::fflush(options.out);
    if (rounds_log) {
      rounds_log->Write({{"round", r.round},
                         {"contributors", r.contributors},
                         {"tokens", r.tokens},
                         {"params_hash", absl::StrFormat("%016x", r.params_hash)},
                         {"wall_s", wall}});
    }
  });
  auto server = GrpcServer::Start(sync.get(), options.server);
  if (!server.ok()) return server.status();
  std::fprintf(options.out, "atoll coordinator: run '%s' listening on %s (%d islands, H = %d, %llu rounds)\n",
               config.outer.run_id.c_str(), (*server)->address().c_str(), config.outer.islands,
               config.outer.sync_every, (unsigned long long)total_rounds);
  std::fflush(options.out);
  while (options.stop == nullptr || !options.stop->load()) {
    if (sync->round() >= total_rounds && sync->num_members() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  (*server)->Shutdown();
  std::fprintf(options.out, "atoll coordinator: stopped after %llu rounds, params %016llx\n",
               (unsigned long long)sync->round(), (unsigned long long)sync->params_hash());
  std::fflush(options.out);
  return absl::OkStatus();
}

}  // namespace atl
