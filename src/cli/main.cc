// atoll: train one language model across islands joined by slow links.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "outer/shard_router.h"
#include "src/cli/compare_command.h"
#include "src/config/config.h"
#include "src/service/coordinator.h"
#include "src/net/grpc_transport.h"
#include "src/island/island_loop.h"
#include "src/cli/launch.h"
#include "src/cli/loadtest_command.h"
#include "src/cli/local_command.h"
#include "src/cli/model_commands.h"
#include "src/cli/plan_command.h"
#include "src/cli/train_command.h"

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

// The options every command may share, filled by CLI11.
struct CommandLine {
  std::string config_path, run_dir, token_file;
  std::string metrics_listen, http_listen;  // off when empty
  atl::TlsFiles tls;
  int argc = 0;
  char** argv = nullptr;
};

// A subcommand and what runs it once parsed; `overrides` are its --key=value arguments.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(const std::vector<atl::Override>& overrides)> run;
};

// The run's config: --config and the --key=value overrides.
absl::StatusOr<atl::Config> RunConfig(const CommandLine& cl,
                                      const std::vector<atl::Override>& overrides) {
  return atl::LoadConfig(cl.config_path, overrides);
}

Command AddTrain(CLI::App& app, CommandLine& cl) {
  auto* c = app.add_subcommand("train", "train one island alone (the centralized baseline)");
  c->add_option("--config", cl.config_path, "TOML config (presets in deploy/configs/)");
  c->add_option("--run-dir", cl.run_dir, "directory for config.toml, metrics.jsonl, checkpoints")
      ->required();
  auto resume = std::make_shared<bool>(false);
  c->add_flag("--resume", *resume, "continue from the newest checkpoint in --run-dir");
  return {c, [&cl, resume](const std::vector<atl::Override>& overrides) {
            auto config = RunConfig(cl, overrides);
            if (!config.ok()) return Fail(config.status());
            atl::TrainOptions options;
            options.run_dir = cl.run_dir;
            options.resume = *resume;
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
            std::printf(
                "%s at step %lld: %s, %lld tokens, %.0f tokens/s, wall %.1fs; checkpoint in %s\n",
                summary->stopped ? "stopped" : "done", (long long)summary->step, val.c_str(),
                (long long)summary->tokens, summary->tokens_per_s, summary->wall_s,
                cl.run_dir.c_str());
            return summary->stopped ? 130 : 0;
          }};
}

// --metrics-listen (and --http-listen where there is a status page): off unless given.
void AddMonitoringFlags(CLI::App* c, CommandLine& cl, bool status_page) {
  c->add_option("--metrics-listen", cl.metrics_listen,
                "HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0: any free port)");
  if (status_page) {
    c->add_option("--http-listen", cl.http_listen,
                  "HOST:PORT to serve the status page on (/, /api/status, /metrics, /healthz, "
                  "/readyz)");
  }
}

// The flags `atoll coordinator` and `atoll sync-server` share.
struct ServiceFlags {
  std::string listen = "127.0.0.1:0";
  std::string resume_dir;
  std::string shard_token_file;
};

void AddServiceFlags(CLI::App* c, CommandLine& cl, ServiceFlags& f) {
  c->add_option("--config", cl.config_path, "TOML config of the run");
  c->add_option("--listen", f.listen, "HOST:PORT to listen on (port 0: any free port)");
  c->add_option("--run-dir", cl.run_dir, "directory for rounds.jsonl and the durable service state");
  c->add_option("--resume", f.resume_dir,
                "continue from the durable service state in RUN_DIR (and keep writing there)");
  c->add_option("--token-file", cl.token_file, "file holding the run token (else $ATOLL_TOKEN)");
  c->add_option("--shard-token-file", f.shard_token_file,
                "outer.shards > 1: file holding the secret shard servers present to the "
                "coordinator, which islands do not hold (else $ATOLL_SHARD_TOKEN)");
  c->add_option("--tls-cert", cl.tls.cert, "TLS certificate chain (PEM)");
  c->add_option("--tls-key", cl.tls.key, "TLS private key (PEM)");
  c->add_option("--tls-ca", cl.tls.ca,
                "mutual TLS: islands must present a certificate signed by this CA (PEM) whose "
                "common name is their name, shard servers one named shard-K "
                "(deploy/make_certs.sh makes them)");
}

// Serves the run's coordinator, or with `shard` >= 0 one shard server of it.
int RunService(CommandLine& cl, const ServiceFlags& f, const std::vector<atl::Override>& overrides,
               atl::CoordinatorOptions options) {
  auto config = RunConfig(cl, overrides);
  if (!config.ok()) return Fail(config.status());
  auto token = atl::LoadToken(cl.token_file);
  if (!token.ok()) return Fail(token.status());
  if (config->outer.shards > 1) {
    auto shard_token = atl::LoadToken(f.shard_token_file, atl::kShardTokenEnv);
    if (!shard_token.ok()) return Fail(shard_token.status());
    (options.shard >= 0 ? options.shard_token : options.server.shard_token) = *shard_token;
  }
  options.server.listen = f.listen;
  options.server.token = *token;
  options.server.tls = cl.tls;
  options.run_dir = f.resume_dir.empty() ? cl.run_dir : f.resume_dir;
  options.resume = !f.resume_dir.empty();
  options.metrics_listen = cl.metrics_listen;
  options.http_listen = cl.http_listen;
  options.rpc_timeout_s = config->outer.rpc_timeout_s;
  options.stop = &g_stop;
  if (auto s = atl::RunCoordinator(*config, options); !s.ok()) return Fail(s);
  return 0;
}

Command AddCoordinator(CLI::App& app, CommandLine& cl) {
  auto* c = app.add_subcommand("coordinator", "host the coordinator and outer-sync service");
  auto f = std::make_shared<ServiceFlags>();
  AddServiceFlags(c, cl, *f);
  AddMonitoringFlags(c, cl, /*status_page=*/true);
  return {c, [&cl, f](const std::vector<atl::Override>& overrides) {
            return RunService(cl, *f, overrides, atl::CoordinatorOptions());
          }};
}

Command AddSyncServer(CLI::App& app, CommandLine& cl) {
  auto* c = app.add_subcommand(
      "sync-server", "host shard K of N of a sharded outer-sync service (outer.shards = N): the "
      "fragments f with f mod N = K, their durable state, the membership mirrored from the "
      "coordinator");
  auto f = std::make_shared<ServiceFlags>();
  auto shard = std::make_shared<std::string>();
  auto o = std::make_shared<atl::CoordinatorOptions>();
  AddServiceFlags(c, cl, *f);
  AddMonitoringFlags(c, cl, /*status_page=*/false);
  c->add_option("--shard", *shard, "K/N: this server's shard index and the run's shard count")
      ->required();
  c->add_option("--coordinator", o->coordinator, "HOST:PORT of the run's coordinator")->required();
  c->add_option("--advertise", o->advertise,
                "HOST:PORT islands reach this server at (default: the address it listens on)");
  return {c, [&cl, f, shard, o](const std::vector<atl::Override>& overrides) {
            int k = -1, n = 0;
            const auto slash = shard->find('/');
            if (slash == std::string::npos || !absl::SimpleAtoi(shard->substr(0, slash), &k) ||
                !absl::SimpleAtoi(shard->substr(slash + 1), &n) || k < 0 || n < 2 || k >= n) {
              return Fail(absl::InvalidArgumentError(
                  "--shard '" + *shard + "' is not K/N with 0 <= K < N and N >= 2"));
            }
            std::vector<atl::Override> all = overrides;
            all.push_back({"outer.shards", absl::StrCat(n)});
            atl::CoordinatorOptions options = *o;
            options.shard = k;
            return RunService(cl, *f, all, options);
          }};
}

struct IslandFlags {
  std::string coordinator, name;
  bool resume = false;
  int nproc = 1, max_restarts = 0;
  double throttle = 1.0;
};

// The agent of a multi-rank island: its ranks are this command again, one process each.
int LaunchRanks(const CommandLine& cl, const IslandFlags& f, const atl::Config& config) {
  atl::LaunchOptions launch;
  launch.binary = SelfPath();
  for (int i = 2; i < cl.argc; ++i) {
    const std::string a = cl.argv[i];
    if (a == "--nproc" || a == "--max-restarts") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0 || a.rfind("--max-restarts=", 0) == 0) continue;
    launch.args.push_back(a);
  }
  launch.nproc = f.nproc;
  launch.max_restarts = f.max_restarts;
  launch.grace_s = config.parallelism.collective_timeout_s + 5;
  launch.stop = &g_stop;
  if (auto s = atl::LaunchIsland(launch); !s.ok()) return Fail(s);
  return 0;
}

int RunIslandRank(const CommandLine& cl, const IslandFlags& f, const atl::Config& config,
                  const atl::inner::parallel::RankInfo& rank) {
  auto token = atl::LoadToken(cl.token_file);
  if (!token.ok()) return Fail(token.status());
  atl::GrpcTransportOptions t;
  t.target = f.coordinator;
  t.token = *token;
  t.tls = cl.tls;
  t.rpc_timeout_s = config.outer.rpc_timeout_s;
  t.round_timeout_s = config.outer.round_timeout_s;
  t.connections = config.outer.connections;
  auto coordinator = atl::GrpcTransport::Create(t);
  if (!coordinator.ok()) return Fail(coordinator.status());
  // A sharded service: each fragment's data calls go to its shard, with the same options.
  atl::outer::ShardRouter router(
      *std::move(coordinator),
      [t](const std::string& address) -> absl::StatusOr<std::unique_ptr<atl::outer::Transport>> {
        atl::GrpcTransportOptions to_shard = t;
        to_shard.target = address;
        ATL_ASSIGN_OR_RETURN(auto opened, atl::GrpcTransport::Create(to_shard));
        return std::unique_ptr<atl::outer::Transport>(std::move(opened));
      });
  atl::IslandOptions options;
  options.name = f.name;
  options.run_dir = cl.run_dir;
  options.tty = false;
  options.stop = &g_stop;
  options.throttle = f.throttle;
  options.resume = f.resume;
  options.rank = rank;
  options.collective_timeout_s = config.parallelism.collective_timeout_s;
  options.metrics_listen = cl.metrics_listen;
  auto summary = atl::RunIsland(config, router, options);
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

Command AddIsland(CLI::App& app, CommandLine& cl) {
  auto* c = app.add_subcommand("island", "run one island of a DiLoCo run");
  auto f = std::make_shared<IslandFlags>();
  c->add_option("--coordinator", f->coordinator, "HOST:PORT of the coordinator")->required();
  c->add_option("--name", f->name, "island name, unique in the run")->required();
  c->add_option("--config", cl.config_path, "TOML config (the [model] must match the coordinator's)");
  c->add_option("--run-dir", cl.run_dir, "directory for metrics.jsonl and summary.json")->required();
  c->add_option("--token-file", cl.token_file, "file holding the run token (else $ATOLL_TOKEN)");
  c->add_option("--tls-ca", cl.tls.ca, "trust these root certificates (PEM) and use TLS");
  c->add_option("--tls-cert", cl.tls.cert, "mutual TLS: this island's certificate (PEM)");
  c->add_option("--tls-key", cl.tls.key, "mutual TLS: this island's private key (PEM)");
  c->add_flag("--resume", f->resume,
              "continue from the newest checkpoint in --run-dir (AdamW state, data cursor), "
              "rejoining the run");
  c->add_option("--nproc", f->nproc,
                "ranks of this island on this machine (like torchrun --nproc-per-node); "
                "ranks started by another launcher read RANK, WORLD_SIZE, LOCAL_RANK, "
                "MASTER_ADDR, MASTER_PORT");
  c->add_option("--max-restarts", f->max_restarts,
                "with --nproc: when a rank fails, restart the island from its newest "
                "checkpoint at most this many times");
  c->add_option("--throttle", f->throttle,
                "make every inner step take X times as long (a slower island, for tests and "
                "demos)");
  AddMonitoringFlags(c, cl, /*status_page=*/false);
  return {c, [&cl, f](const std::vector<atl::Override>& overrides) {
            auto config = RunConfig(cl, overrides);
            if (!config.ok()) return Fail(config.status());
            auto rank = atl::inner::parallel::RankInfoFromEnvironment();
            if (!rank.ok()) return Fail(rank.status());
            if (f->nproc > 1 && std::getenv("WORLD_SIZE") == nullptr) {
              return LaunchRanks(cl, *f, *config);
            }
            return RunIslandRank(cl, *f, *config, *rank);
          }};
}

struct IslandsFlags {
  int islands = 2;
  std::string throttles;
};

// Commands that start M islands on this machine share their options.
CLI::App* AddIslandsCommand(CLI::App& app, CommandLine& cl, IslandsFlags& f, const char* name,
                            const char* help, const char* run_dir_help) {
  auto* c = app.add_subcommand(name, help);
  c->add_option("--islands", f.islands, "number of islands (M)");
  c->add_option("--throttle", f.throttles,
                "slow-down factor of each island, comma-separated (e.g. 1,3: island1 steps 3x "
                "slower); missing ones are 1");
  c->add_option("--config", cl.config_path, "TOML config of the run");
  c->add_option("--run-dir", cl.run_dir, run_dir_help)->required();
  return c;
}

struct LocalFlags {
  IslandsFlags islands;
  std::vector<std::string> kills, terms, joins;
  int nproc = 1, max_restarts = 0;
};

Command AddLocal(CLI::App& app, CommandLine& cl) {
  auto f = std::make_shared<LocalFlags>();
  auto* c = AddIslandsCommand(app, cl, f->islands, "local",
                              "run a coordinator and M islands on this machine",
                              "directory for every process' logs and outputs");
  c->add_option("--kill", f->kills, "SIGKILL an island at a round, e.g. island1@round3 (repeatable)");
  c->add_option("--term", f->terms, "SIGTERM an island at a round: it leaves gracefully");
  c->add_option("--join", f->joins, "start an island at a round, e.g. island2@round5 or 1@round5");
  c->add_option("--nproc", f->nproc, "ranks per island (each island its own agent)");
  c->add_option("--max-restarts", f->max_restarts,
                "per island: restarts from its checkpoint when one of its ranks fails "
                "(--kill island0.1@round2 rehearses it)");
  AddMonitoringFlags(c, cl, /*status_page=*/true);
  c->get_option("--metrics-listen")
      ->description("HOST:PORT of the coordinator's Prometheus metrics; island i serves its own on "
                    "PORT + 1 + i (port 0: each any free port; every process prints where)");
  return {c, [&cl, f, c](const std::vector<atl::Override>& overrides) {
            auto config = RunConfig(cl, overrides);
            if (!config.ok()) return Fail(config.status());
            auto throttle = atl::ParseThrottles(f->islands.throttles, f->islands.islands);
            if (!throttle.ok()) return Fail(throttle.status());
            atl::LocalOptions options;
            options.islands = f->islands.islands;
            options.shards = config->outer.shards;
            options.nproc = f->nproc;
            options.metrics_listen = cl.metrics_listen;
            options.http_listen = cl.http_listen;
            options.max_restarts = f->max_restarts;
            options.config_path = cl.config_path;
            options.overrides = c->remaining();
            options.throttle = *throttle;
            for (auto [kind, list] : {std::pair{atl::LocalEvent::kKill, &f->kills},
                                      std::pair{atl::LocalEvent::kTerm, &f->terms},
                                      std::pair{atl::LocalEvent::kJoin, &f->joins}}) {
              for (const auto& text : *list) {
                auto e = atl::ParseLocalEvent(kind, text);
                if (!e.ok()) return Fail(e.status());
                options.events.push_back(*e);
              }
            }
            options.run_dir = cl.run_dir;
            options.stop = &g_stop;
            auto summary = atl::RunLocal(options);
            if (!summary.ok()) return Fail(summary.status());
            std::printf("atoll local: %d islands done in %.1fs; outputs in %s\n",
                        options.islands, summary->wall_s, cl.run_dir.c_str());
            return 0;
          }};
}

Command AddCompare(CLI::App& app, CommandLine& cl) {
  auto f = std::make_shared<IslandsFlags>();
  auto* c = AddIslandsCommand(app, cl, *f, "compare",
                              "DiLoCo variants against the centralized baseline at equal compute",
                              "directory for every run and the report");
  auto sweeps = std::make_shared<std::vector<std::string>>();
  c->add_option("--sweep", *sweeps,
                "KEY=V1,V2,...: run every method over these values (repeatable: the grid of all) "
                "and report each at its best; the same command again resumes a stopped sweep");
  return {c, [&cl, f, c, sweeps](const std::vector<atl::Override>& overrides) {
            if (auto config = RunConfig(cl, overrides); !config.ok()) return Fail(config.status());
            auto throttle = atl::ParseThrottles(f->throttles, f->islands);
            if (!throttle.ok()) return Fail(throttle.status());
            atl::CompareOptions options;
            options.islands = f->islands;
            options.config_path = cl.config_path;
            options.overrides = c->remaining();
            options.throttle = *throttle;
            options.sweeps = *sweeps;
            options.run_dir = cl.run_dir;
            options.stop = &g_stop;
            auto results = atl::RunCompare(options);
            if (!results.ok()) return Fail(results.status());
            return 0;
          }};
}

struct LoadtestFlags {
  std::string params = "20M";
  int islands = 4, rounds = 3, shards = 1;
};

Command AddLoadtest(CLI::App& app, CommandLine& cl) {
  auto f = std::make_shared<LoadtestFlags>();
  auto* c = app.add_subcommand(
      "loadtest", "the outer-sync service under load: synthetic islands push random "
      "pseudo-gradients of a model of --params parameters through a real coordinator");
  c->add_option("--params", f->params, "model parameters, e.g. 500M or 1.5B");
  c->add_option("--islands", f->islands, "synthetic islands (M)");
  c->add_option("--rounds", f->rounds, "outer rounds");
  c->add_option("--shards", f->shards, "service shards (1: one coordinator)");
  c->add_option("--config", cl.config_path, "TOML config of the run (its [model] is replaced)");
  c->add_option("--run-dir", cl.run_dir, "directory for the coordinator's log and loadtest.json")
      ->required();
  return {c, [&cl, f](const std::vector<atl::Override>& overrides) {
            atl::LoadtestOptions options;
            if (!ParseCount(f->params, &options.params)) {
              return Fail(absl::InvalidArgumentError(
                  "--params '" + f->params + "' is not a count such as 20000000, 500M or 1.5B"));
            }
            options.islands = f->islands;
            options.rounds = f->rounds;
            options.shards = f->shards;
            options.run_dir = cl.run_dir;
            options.config_path = cl.config_path;
            options.overrides = overrides;  // the load test resolves its own config
            options.binary = SelfPath();
            options.stop = &g_stop;
            auto report = atl::RunLoadtest(options);
            if (!report.ok()) return Fail(report.status());
            return 0;
          }};
}

Command AddPlan(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::PlanOptions>();
  auto params = std::make_shared<std::string>();
  auto* c = app.add_subcommand(
      "plan", "before renting GPUs: per method, the compute utilization on a link, the bandwidth "
      "a target utilization needs, bytes per island per round and per hour (a replay of the "
      "schedule, no network)");
  c->add_option("--params", *params, "model parameters, e.g. 1e9 or 1.5B (else --config's model)");
  c->add_option("--config", cl.config_path,
                "TOML config: its model, islands, H, fragments, tau and codec");
  c->add_option("--step-time", o->step_time_s, "seconds of compute per inner step")->required();
  c->add_option("--islands", o->islands, "islands (M)");
  c->add_option("--bandwidth", o->bandwidth, "per island, each way: e.g. 1gbit, 20mbit");
  c->add_option("--latency", o->latency, "one way, e.g. 50ms");
  c->add_option("--connections", o->connections,
                "TCP connections per island (default: the config's outer.connections, or 1)");
  c->add_option("--tcp-window-mib", o->tcp_window_mib, "TCP window per connection, MiB");
  c->add_option("--method", o->method,
                "data_parallel, diloco or streaming (one row with these settings); default: "
                "the ladder of the Streaming DiLoCo paper's Table 4");
  c->add_option("--sync-every", o->sync_every, "H");
  c->add_option("--fragments", o->fragments, "P (streaming)");
  c->add_option("--tau", o->tau, "inner steps of overlap (streaming)");
  c->add_option("--codec", o->codec, "fp32, bf16, int8, fp4_e2m1, fp4_e3m0");
  c->add_option("--topology", o->topology,
                "star (atoll's service, default) or ring (the paper's all-reduce)");
  c->add_option("--target-utilization", o->target, "e.g. 0.95: the bandwidth each method needs");
  c->add_option("--steps", o->steps, "a run of this many steps, ending synced (default: steady)");
  c->add_option("--commit-ns-per-param", o->commit_ns_per_param,
                "the service's commit time per parameter per island (measured: atoll loadtest)");
  c->add_option("--service-bandwidth", o->service_bandwidth,
                "the coordinator's own link, each way, shared by all islands (default: unlimited)");
  c->add_option("--svg", o->svg, "write utilization vs bandwidth per method to this SVG file");
  c->add_flag("--json", o->json, "one JSON object per method instead of the table");
  return {c, [&cl, o, params](const std::vector<atl::Override>& overrides) {
            if (!params->empty() && !ParseCount(*params, &o->params)) {
              return Fail(absl::InvalidArgumentError(
                  "--params '" + *params + "' is not a count such as 1e9, 500M or 1.5B"));
            }
            o->config_path = cl.config_path;
            o->overrides = overrides;
            if (auto s = atl::RunPlan(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

// Export and generate take no --key=value overrides: the model is the source's.
int NoOverrides(const std::vector<atl::Override>& overrides) {
  if (overrides.empty()) return 0;
  return Fail(absl::InvalidArgumentError("unexpected argument '--" + overrides[0].first + "'"));
}

Command AddExport(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::ExportOptions>();
  auto* c = app.add_subcommand(
      "export", "write a model as safetensors: the global model of a run (its coordinator's "
      "state, or an `atoll local` run directory) or an island's / the baseline's checkpoint");
  c->add_option("source", o->source,
                "run directory, coordinator directory or service-state.pb, checkpoint, or "
                "safetensors file")->required();
  c->add_option("--out", o->out, "the safetensors file to write")->required();
  c->add_option("--format", o->format, "safetensors (the only format)");
  c->add_option("--names", o->names,
                "gpt2 (Hugging Face GPT-2 names and layout, default) or atoll (atoll's own)");
  c->add_option("--config", cl.config_path,
                "the run's config, for a service state without config.toml beside it");
  return {c, [&cl, o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            o->config_path = cl.config_path;
            if (auto s = atl::RunExport(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddImport(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::ImportOptions>();
  auto* c = app.add_subcommand(
      "import", "start runs from a safetensors file: check every tensor against the model it "
      "describes and write a run config with that [model] and train.init_from set");
  c->add_option("file", o->file, "safetensors file (GPT-2 or atoll names)")->required();
  c->add_option("--out", o->out, "the run config to write (TOML, must not exist)")->required();
  c->add_option("--config", cl.config_path,
                "base config: data, training, outer settings (and model.n_head when the file has "
                "no atoll metadata)");
  c->footer(KeysHelp());  // the base config takes --key=value overrides
  return {c, [&cl, o](const std::vector<atl::Override>& overrides) {
            o->config_path = cl.config_path;
            o->overrides = overrides;
            if (auto s = atl::RunImport(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

Command AddGenerate(CLI::App& app, CommandLine& cl) {
  auto o = std::make_shared<atl::GenerateOptions>();
  auto* c = app.add_subcommand("generate", "sample text from a model (byte-level, vocab 256)");
  c->add_option("--checkpoint", o->source,
                "run directory, coordinator directory, checkpoint, or safetensors file")->required();
  c->add_option("--prompt", o->prompt, "text to continue")->required();
  c->add_option("--tokens", o->tokens, "new tokens (bytes) to sample");
  c->add_option("--temperature", o->temperature, "softmax temperature (0: greedy)");
  c->add_option("--top-k", o->top_k, "sample among the k likeliest tokens (0: all)");
  c->add_option("--seed", o->seed, "sampling seed");
  c->add_option("--config", cl.config_path,
                "the run's config, for a service state without config.toml beside it");
  return {c, [&cl, o](const std::vector<atl::Override>& overrides) {
            if (int rc = NoOverrides(overrides)) return rc;
            o->config_path = cl.config_path;
            if (auto s = atl::RunGenerate(*o); !s.ok()) return Fail(s);
            return 0;
          }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"atoll: DiLoCo and Streaming DiLoCo training across islands"};
  app.require_subcommand(1);
  CommandLine cl;
  cl.argc = argc;
  cl.argv = argv;
  std::vector<Command> commands = {AddTrain(app, cl),   AddCoordinator(app, cl), AddSyncServer(app, cl),
                                   AddIsland(app, cl),  AddLocal(app, cl),
                                   AddCompare(app, cl), AddLoadtest(app, cl),
                                   AddPlan(app, cl)};
  for (auto& command : commands) command.app->footer(KeysHelp());
  for (auto* add : {AddExport, AddImport, AddGenerate}) commands.push_back(add(app, cl));
  for (auto& command : commands) command.app->allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  for (auto& command : commands) {
    if (!command.app->parsed()) continue;
    auto overrides = atl::ParseOverrides(command.app->remaining());
    if (!overrides.ok()) return Fail(overrides.status());
    return command.run(*overrides);
  }
  return 0;
}
