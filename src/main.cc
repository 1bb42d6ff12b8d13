// atoll: train one language model across islands joined by slow links.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "src/config.h"
#include "src/compare_command.h"
#include "src/coordinator_command.h"
#include "src/grpc_transport.h"
#include "src/island_loop.h"
#include "src/launch.h"
#include "src/loadtest_command.h"
#include "src/local_command.h"
#include "src/train_command.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  if (g_stop.exchange(true)) std::_Exit(130);  // second Ctrl-C: leave now
}

std::string KeysHelp() {
  std::string out = "Config keys (set in the TOML file or as --key=value):\n";
  for (const auto& [key, doc] : atl::DescribeKeys()) {
    out += absl::StrFormat("  %-24s %s\n", key, doc);
  }
  return out;
}

// "500M", "1.5B", "2e9", "20000000": a parameter count.
bool ParseCount(const std::string& text, int64_t* out) {
  double scale = 1;
  std::string number = text;
  if (!number.empty()) {
    switch (number.back()) {
      case 'K': case 'k': scale = 1e3; break;
      case 'M': case 'm': scale = 1e6; break;
      case 'B': case 'b': case 'G': case 'g': scale = 1e9; break;
      default: break;
    }
    if (scale != 1) number.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(v * scale >= 1) ||
      v * scale > 1e15) {
    return false;
  }
  *out = int64_t(v * scale);
  return true;
}

// This program, to start it again (an island's ranks, the load test's coordinator).
std::string SelfPath() {
  char self[4096];
  if (const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1); n > 0) {
    return std::string(self, size_t(n));
  }
  return "/proc/self/exe";
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "atoll: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"atoll: DiLoCo and Streaming DiLoCo training across islands"};
  app.require_subcommand(1);

  std::string config_path, run_dir;
  bool resume = false;
  auto* train = app.add_subcommand("train", "train one island alone (the centralized baseline)");
  train->add_option("--config", config_path, "TOML config (presets in deploy/configs/)");
  train->add_option("--run-dir", run_dir, "directory for config.toml, metrics.jsonl, checkpoints")
      ->required();
  train->add_flag("--resume", resume, "continue from the newest checkpoint in --run-dir");
  train->allow_extras();
  train->footer(KeysHelp());

  std::string listen = "127.0.0.1:0", coordinator_addr, name, token_file;
  atl::TlsFiles tls;
  auto* coord = app.add_subcommand("coordinator", "host the coordinator and outer-sync service");
  coord->add_option("--config", config_path, "TOML config of the run");
  coord->add_option("--listen", listen, "HOST:PORT to listen on (port 0: any free port)");
  coord->add_option("--run-dir", run_dir, "directory for rounds.jsonl and the durable service state");
  std::string resume_dir;
  coord->add_option("--resume", resume_dir,
                    "continue from the durable service state in RUN_DIR (and keep writing there)");
  coord->add_option("--token-file", token_file, "file holding the run token (else $ATOLL_TOKEN)");
  coord->add_option("--tls-cert", tls.cert, "TLS certificate chain (PEM)");
  coord->add_option("--tls-key", tls.key, "TLS private key (PEM)");
  coord->add_option("--tls-ca", tls.ca,
                    "mutual TLS: islands must present a certificate signed by this CA (PEM) whose "
                    "common name is their name (deploy/make_certs.sh makes them)");
  coord->allow_extras();
  coord->footer(KeysHelp());

  auto* island = app.add_subcommand("island", "run one island of a DiLoCo run");
  island->add_option("--coordinator", coordinator_addr, "HOST:PORT of the coordinator")->required();
  island->add_option("--name", name, "island name, unique in the run")->required();
  island->add_option("--config", config_path, "TOML config (the [model] must match the coordinator's)");
  island->add_option("--run-dir", run_dir, "directory for metrics.jsonl and summary.json")->required();
  island->add_option("--token-file", token_file, "file holding the run token (else $ATOLL_TOKEN)");
  island->add_option("--tls-ca", tls.ca, "trust these root certificates (PEM) and use TLS");
  island->add_option("--tls-cert", tls.cert, "mutual TLS: this island's certificate (PEM)");
  island->add_option("--tls-key", tls.key, "mutual TLS: this island's private key (PEM)");
  bool island_resume = false;
  island->add_flag("--resume", island_resume,
                   "continue from the newest checkpoint in --run-dir (AdamW state, data cursor), "
                   "rejoining the run");
  int nproc = 1, max_restarts = 0;
  island->add_option("--nproc", nproc,
                     "ranks of this island on this machine (like torchrun --nproc-per-node); "
                     "ranks started by another launcher read RANK, WORLD_SIZE, LOCAL_RANK, "
                     "MASTER_ADDR, MASTER_PORT");
  island->add_option("--max-restarts", max_restarts,
                     "with --nproc: when a rank fails, restart the island from its newest "
                     "checkpoint at most this many times");
  double throttle = 1.0;
  island->add_option("--throttle", throttle,
                     "make every inner step take X times as long (a slower island, for tests and "
                     "demos)");
  island->allow_extras();
  island->footer(KeysHelp());

  int islands = 2;
  std::string throttles;
  // Commands that start M islands on this machine share their options.
  auto add_islands_command = [&](const char* name, const char* help, const char* run_dir_help) {
    auto* c = app.add_subcommand(name, help);
    c->add_option("--islands", islands, "number of islands (M)");
    c->add_option("--throttle", throttles,
                  "slow-down factor of each island, comma-separated (e.g. 1,3: island1 steps 3x "
                  "slower); missing ones are 1");
    c->add_option("--config", config_path, "TOML config of the run");
    c->add_option("--run-dir", run_dir, run_dir_help)->required();
    c->allow_extras();
    c->footer(KeysHelp());
    return c;
  };
  auto* local = add_islands_command("local", "run a coordinator and M islands on this machine",
                                    "directory for every process' logs and outputs");
  std::vector<std::string> kills, terms, joins;
  local->add_option("--kill", kills, "SIGKILL an island at a round, e.g. island1@round3 (repeatable)");
  local->add_option("--term", terms, "SIGTERM an island at a round: it leaves gracefully");
  local->add_option("--join", joins, "start an island at a round, e.g. island2@round5 or 1@round5");
  int local_nproc = 1, local_restarts = 0;
  local->add_option("--nproc", local_nproc, "ranks per island (each island its own agent)");
  local->add_option("--max-restarts", local_restarts,
                    "per island: restarts from its checkpoint when one of its ranks fails "
                    "(--kill island0.1@round2 rehearses it)");
  auto* compare =
      add_islands_command("compare", "DiLoCo variants against the centralized baseline at equal "
                          "compute", "directory for every run and the report");

  std::string load_params = "20M";
  int load_islands = 4, load_rounds = 3, load_shards = 1;
  auto* loadtest = app.add_subcommand(
      "loadtest", "the outer-sync service under load: synthetic islands push random "
      "pseudo-gradients of a model of --params parameters through a real coordinator");
  loadtest->add_option("--params", load_params, "model parameters, e.g. 500M or 1.5B");
  loadtest->add_option("--islands", load_islands, "synthetic islands (M)");
  loadtest->add_option("--rounds", load_rounds, "outer rounds");
  loadtest->add_option("--shards", load_shards, "service shards (1: one coordinator)");
  loadtest->add_option("--config", config_path, "TOML config of the run (its [model] is replaced)");
  loadtest->add_option("--run-dir", run_dir, "directory for the coordinator's log and loadtest.json")
      ->required();
  loadtest->allow_extras();
  loadtest->footer(KeysHelp());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  CLI::App* command = app.get_subcommands().front();
  auto overrides = atl::ParseOverrides(command->remaining());
  if (!overrides.ok()) return Fail(overrides.status());
  if (loadtest->parsed()) {
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    atl::LoadtestOptions options;
    if (!ParseCount(load_params, &options.params)) {
      return Fail(absl::InvalidArgumentError("--params '" + load_params +
                                             "' is not a count such as 20000000, 500M or 1.5B"));
    }
    options.islands = load_islands;
    options.rounds = load_rounds;
    options.shards = load_shards;
    options.run_dir = run_dir;
    options.config_path = config_path;
    options.overrides = *overrides;  // the load test resolves its own config
    options.binary = SelfPath();
    options.stop = &g_stop;
    auto report = atl::RunLoadtest(options);
    if (!report.ok()) return Fail(report.status());
    return 0;
  }

  auto config = atl::LoadConfig(config_path, *overrides);
  if (!config.ok()) return Fail(config.status());
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto throttle_list = atl::ParseThrottles(throttles, islands);
  if (!throttle_list.ok()) return Fail(throttle_list.status());

  if (compare->parsed()) {
    atl::CompareOptions options;
    options.islands = islands;
    options.config_path = config_path;
    options.overrides = compare->remaining();
    options.throttle = *throttle_list;
    options.run_dir = run_dir;
    options.stop = &g_stop;
    auto results = atl::RunCompare(options);
    if (!results.ok()) return Fail(results.status());
    return 0;
  }

  if (local->parsed()) {
    atl::LocalOptions options;
    options.islands = islands;
    options.nproc = local_nproc;
    options.max_restarts = local_restarts;
    options.config_path = config_path;
    options.overrides = local->remaining();
    options.throttle = *throttle_list;
    for (auto [kind, list] : {std::pair{atl::LocalEvent::kKill, &kills},
                              std::pair{atl::LocalEvent::kTerm, &terms},
                              std::pair{atl::LocalEvent::kJoin, &joins}}) {
      for (const auto& text : *list) {
        auto e = atl::ParseLocalEvent(kind, text);
        if (!e.ok()) return Fail(e.status());
        options.events.push_back(*e);
      }
    }
    options.run_dir = run_dir;
    options.stop = &g_stop;
    auto summary = atl::RunLocal(options);
    if (!summary.ok()) return Fail(summary.status());
    std::printf("atoll local: %d islands done in %.1fs; outputs in %s\n", islands, summary->wall_s,
                run_dir.c_str());
    return 0;
  }

  if (coord->parsed()) {
    auto token = atl::LoadToken(token_file);
    if (!token.ok()) return Fail(token.status());
    atl::CoordinatorOptions options;
    options.server.listen = listen;
    options.server.token = *token;
    options.server.tls = tls;
    options.run_dir = resume_dir.empty() ? run_dir : resume_dir;
    options.resume = !resume_dir.empty();
    options.stop = &g_stop;
    if (auto s = atl::RunCoordinator(*config, options); !s.ok()) return Fail(s);
    return 0;
  }

  if (island->parsed()) {
    auto rank = atl::inner::parallel::RankInfoFromEnvironment();
    if (!rank.ok()) return Fail(rank.status());
    if (nproc > 1 && std::getenv("WORLD_SIZE") == nullptr) {
      // The agent: the island's ranks are this command again, one process each.
      atl::LaunchOptions launch;
      launch.binary = SelfPath();
      for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--nproc" || a == "--max-restarts") {
          ++i;
          continue;
        }
        if (a.rfind("--nproc=", 0) == 0 || a.rfind("--max-restarts=", 0) == 0) continue;
        launch.args.push_back(a);
      }
      launch.nproc = nproc;
      launch.max_restarts = max_restarts;
      launch.grace_s = config->parallelism.collective_timeout_s + 5;
      launch.stop = &g_stop;
      if (auto s = atl::LaunchIsland(launch); !s.ok()) return Fail(s);
      return 0;
    }
    auto token = atl::LoadToken(token_file);
    if (!token.ok()) return Fail(token.status());
    atl::GrpcTransportOptions t;
    t.target = coordinator_addr;
    t.token = *token;
    t.tls = tls;
    t.rpc_timeout_s = config->outer.rpc_timeout_s;
    t.round_timeout_s = config->outer.round_timeout_s;
    auto transport = atl::GrpcTransport::Create(t);
    if (!transport.ok()) return Fail(transport.status());
    atl::IslandOptions options;
    options.name = name;
    options.run_dir = run_dir;
    options.tty = false;
    options.stop = &g_stop;
    options.throttle = throttle;
    options.resume = island_resume;
    options.rank = *rank;
    options.collective_timeout_s = config->parallelism.collective_timeout_s;
    auto summary = atl::RunIsland(*config, **transport, options);
    if (!summary.ok()) return Fail(summary.status());
    std::printf("[%s] done at step %lld after %llu rounds: %s, compute %.1fs, sync %.1fs, "
                "sent %.1f MiB, received %.1f MiB, global params %016llx\n",
                summary->island_id.c_str(), (long long)summary->step,
                (unsigned long long)summary->rounds,
                summary->last_eval ? absl::StrFormat("val_loss %.4f", summary->last_eval->loss).c_str()
                                   : "no evaluation",
                summary->compute_s, summary->sync_s, summary->bytes_sent / 1048576.0,
                summary->bytes_received / 1048576.0, (unsigned long long)summary->global_hash);
    return 0;
  }

  if (train->parsed()) {
    atl::TrainOptions options;
    options.run_dir = run_dir;
    options.resume = resume;
    options.tty = isatty(fileno(stderr));
    options.stop = &g_stop;
    auto summary = atl::Train(*config, options);
    if (!summary.ok()) return Fail(summary.status());
    std::string val = "no evaluation";
    if (summary->last_eval) {
      val = absl::StrFormat("val_loss %.4f (%.3f %s)", summary->last_eval->loss,
                            summary->last_eval->bits,
                            summary->last_eval->per_byte ? "bits/byte" : "bits/token");
    }
    std::printf("%s at step %lld: %s, %lld tokens, %.0f tokens/s, wall %.1fs; checkpoint in %s\n",
                summary->stopped ? "stopped" : "done", (long long)summary->step, val.c_str(),
                (long long)summary->tokens, summary->tokens_per_s, summary->wall_s,
                run_dir.c_str());
    return summary->stopped ? 130 : 0;
  }
  return 0;
}
