// atoll: train one language model across islands joined by slow links.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
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
#include "absl/strings/str_join.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"
#include "src/cli/compare_command.h"
#include "src/config/config.h"
#include "src/service/coordinator.h"
#include "src/service/initial_state.h"
#include "src/net/grpc_transport.h"
#include "src/island/island_loop.h"
#include "src/cli/launch.h"
#include "src/cli/loadtest_command.h"
#include "src/cli/local_command.h"
#include "src/cli/model_commands.h"
#include "src/cli/plan_command.h"
#include "src/cli/train_command.h"
#include "src/cli/command_line.h"
#include "src/observe/metrics.h"
#include "src/cli/version.h"
#include "src/text/token_shards.h"

namespace atl::cli {
namespace {

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
              val = atl::EvalText(*summary->last_eval);
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
    c->add_option("--http-token-file", cl.http_token_file,
                  "file holding a token the status page, /api/status and /metrics then require "
                  "(Authorization: Bearer TOKEN, or ?token=TOKEN); probes stay open");
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
  if (!cl.http_token_file.empty()) {
    auto http_token = atl::LoadToken(cl.http_token_file, "ATOLL_HTTP_TOKEN");
    if (!http_token.ok()) return Fail(http_token.status());
    options.http_token = *http_token;
  }
  options.rpc_timeout_s = config->outer.rpc_timeout_s;
  options.stop = &g_stop;
  options.make_sync = [](const atl::Config& c, int shard) { return atl::MakeSyncServer(c, shard); };
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
  auto transport = atl::ConnectIsland(f.coordinator, *token, cl.tls, config.outer);
  if (!transport.ok()) return Fail(transport.status());
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
  auto summary = atl::RunIsland(config, **transport, options);
  if (!summary.ok()) return Fail(summary.status());
  // The global parameters' hash as the coordinator prints it: one per fragment.
  std::string hashes;
  for (uint64_t h : summary->fragment_hashes) absl::StrAppend(&hashes, hashes.empty() ? "" : " ", absl::StrFormat("%016x", h));
  if (!summary->whole_fragments) absl::StrAppend(&hashes, " (rank 0's ranges)");
  std::printf("[%s] done at step %lld after %llu rounds: %s, compute %.1fs, sync %.1fs, "
              "sent %.1f MiB, received %.1f MiB, global params %s\n",
              summary->island_id.c_str(), (long long)summary->step,
              (unsigned long long)summary->rounds,
              summary->last_eval ? absl::StrFormat("val_loss %.4f", summary->last_eval->loss).c_str()
                                 : "no evaluation",
              summary->compute_s, summary->idle_s, summary->bytes_sent / 1048576.0,
              summary->bytes_received / 1048576.0, hashes.c_str());
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
  std::vector<std::string> kills, terms, joins, stops, island_sets;
  std::string chaos;
  int nproc = 1, max_restarts = 0;
};

// --island-set ISLAND:KEY=VALUE: the island must be one of the run's, and its config with the key
// must load.
absl::Status AddIslandSets(const CommandLine& cl, const std::vector<std::string>& sets,
                           const std::vector<atl::Override>& overrides,
                           atl::LocalOptions& options) {
  for (const auto& text : sets) {
    const size_t colon = text.find(':');
    const size_t eq = text.find('=', colon == std::string::npos ? 0 : colon);
    if (colon == std::string::npos || colon == 0 || eq == std::string::npos || eq == colon + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--island-set '", text, "': expected ISLAND:KEY=VALUE, e.g. "
          "island3:outer.fault=sign_flip"));
    }
    const std::string island = text.substr(0, colon), arg = "--" + text.substr(colon + 1);
    bool known = false;
    for (int i = 0; i < options.islands; ++i) known |= island == absl::StrCat("island", i);
    for (const auto& e : options.events) {
      known |= e.kind == atl::LocalEvent::kJoin && e.island == island;
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--island-set '", text, "': no island '", island, "' in this run (island0 .. island",
          options.islands - 1, " or one of --join)"));
    }
    std::vector<atl::Override> own = overrides;
    ATL_ASSIGN_OR_RETURN(const auto parsed, atl::ParseOverrides({arg}));
    own.insert(own.end(), parsed.begin(), parsed.end());
    ATL_RETURN_IF_ERROR(RunConfig(cl, own).status());
    options.island_overrides[island].push_back(arg);
  }
  return absl::OkStatus();
}

Command AddLocal(CLI::App& app, CommandLine& cl) {
  auto f = std::make_shared<LocalFlags>();
  auto* c = AddIslandsCommand(app, cl, f->islands, "local",
                              "run a coordinator and M islands on this machine",
                              "directory for every process' logs and outputs");
  c->add_option("--kill", f->kills, "SIGKILL an island at a round, e.g. island1@round3 (repeatable)");
  c->add_option("--term", f->terms, "SIGTERM an island at a round: it leaves gracefully");
  c->add_option("--join", f->joins, "start an island at a round, e.g. island2@round5 or 1@round5");
  c->add_option("--stop", f->stops,
                "SIGSTOP an island at a round for SECONDS (a paused island), e.g. island1@round3:4");
  c->add_option("--island-set", f->island_sets,
                "ISLAND:KEY=VALUE: a config key for one island alone, e.g. "
                "island3:outer.fault=sign_flip or island2:data.shuffle_tokens=true (repeatable)");
  c->add_option("--nproc", f->nproc, "ranks per island (each island its own agent)");
  c->add_option("--chaos", f->chaos,
                "seed=N,every=S,kinds=kill+stop,down=S: from the first commit until an island "
                "finishes, SIGKILL (restart from its checkpoint) or SIGSTOP an island at random "
                "times (every S seconds on average, drawn from the seed) for S seconds; reports "
                "goodput, rounds short of an island, rejoin times, final bit-identity");
  c->add_option("--max-restarts", f->max_restarts,
                "per island: restarts from its checkpoint when one of its ranks fails "
                "(--kill island0.1@round2 rehearses it)");
  AddMonitoringFlags(c, cl, /*status_page=*/true);
  c->get_option("--metrics-listen")
      ->description("HOST:PORT of the coordinator's Prometheus metrics; island i serves its own on "
                    "PORT + 1 + i (port 0: each any free port; every process prints where)");
  return {c, [&cl, f, c](const std::vector<atl::Override>& overrides) {
            // The islands it starts are the config's: the checks see outer.islands = --islands.
            std::vector<atl::Override> with_islands = overrides;
            with_islands.emplace_back("outer.islands", std::to_string(f->islands.islands));
            auto config = RunConfig(cl, with_islands);
            if (!config.ok()) return Fail(config.status());
            // The data and its tokenizer, checked before any process starts.
            if (auto s = atl::text::CheckData(config->data, config->model); !s.ok()) return Fail(s);
            auto throttle = atl::ParseThrottles(f->islands.throttles, f->islands.islands);
            if (!throttle.ok()) return Fail(throttle.status());
            atl::LocalOptions options;
            options.islands = f->islands.islands;
            options.shards = config->outer.shards;
            options.nproc = f->nproc;
            options.metrics_listen = cl.metrics_listen;
            options.http_listen = cl.http_listen;
            options.http_token_file = cl.http_token_file;
            options.max_restarts = f->max_restarts;
            options.config_path = cl.config_path;
            options.overrides = c->remaining();
            options.throttle = *throttle;
            for (auto [kind, list] : {std::pair{atl::LocalEvent::kKill, &f->kills},
                                      std::pair{atl::LocalEvent::kTerm, &f->terms},
                                      std::pair{atl::LocalEvent::kJoin, &f->joins},
                                      std::pair{atl::LocalEvent::kStop, &f->stops}}) {
              for (const auto& text : *list) {
                auto e = atl::ParseLocalEvent(kind, text);
                if (!e.ok()) return Fail(e.status());
                options.events.push_back(*e);
              }
            }
            if (!f->chaos.empty()) {
              auto chaos = atl::ParseChaos(f->chaos);
              if (!chaos.ok()) return Fail(chaos.status());
              options.chaos = *chaos;
              const int model_parallel = config->parallelism.tensor_parallel_degree *
                                         config->parallelism.pipeline_parallel_degree;
              options.tokens_per_island = uint64_t(config->train.steps) *
                                          config->tokens_per_rank_step() *
                                          uint64_t(std::max(1, f->nproc / model_parallel));
            }
            if (auto s = AddIslandSets(cl, f->island_sets, with_islands, options); !s.ok()) {
              return Fail(s);
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
  auto dry_run = std::make_shared<bool>(false);
  c->add_flag("--dry-run", *dry_run,
              "check every run's config (each method at each grid point), say what each method "
              "changes of it, and stop before the first run");
  return {c, [&cl, f, c, sweeps, dry_run](const std::vector<atl::Override>& overrides) {
            // Each key here; the runs' whole configs in RunCompare (a method changes some keys).
            if (auto config = atl::LoadConfig(cl.config_path, overrides, atl::ConfigChecks::kKeys);
                !config.ok()) {
              return Fail(config.status());
            }
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
            options.dry_run = *dry_run;
            auto results = atl::RunCompare(options);
            if (!results.ok()) return Fail(results.status());
            return 0;
          }};
}

// "unknown command 'trian' (did you mean 'train'?)": CLI11 itself only says that one is required.
// Checks each level: `atoll tokenizer trian` too.
absl::Status CheckCommandNames(const CLI::App& app, int argc, char** argv) {
  const CLI::App* level = &app;
  std::string path = "atoll";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') return absl::OkStatus();
    const auto subs = level->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return absl::OkStatus();
    std::vector<std::string> names;
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : subs) {
      names.push_back(sub->get_name());
      if (sub->get_name() == arg) next = sub;
    }
    if (next == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown command '", path, " ", arg, "'", DidYouMean(arg, names, '\'', path + " "),
          "; the commands are ", absl::StrJoin(names, ", "), " (", path, " --help)"));
    }
    level = next;
    path = absl::StrCat(path, " ", arg);
  }
  return absl::OkStatus();
}

// An unknown --name: the nearest of the command's own flags and every config key.
absl::Status CheckOverrideNames(const CLI::App& command, const std::vector<atl::Override>& overrides) {
  std::vector<std::string> keys, names;
  for (const auto& [key, doc] : atl::DescribeKeys()) keys.push_back(key);
  for (const CLI::Option* o : command.get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back(l);
  }
  names.insert(names.end(), keys.begin(), keys.end());
  for (const auto& [key, value] : overrides) {
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    const std::string hint = DidYouMean(key, names, '\'', "--");
    if (key.find('.') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("unknown config key '", key, "' (command line)", hint));
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown option '--", key, "' of 'atoll ",
                                                   command.get_name(), "'", hint, "; see atoll ",
                                                   command.get_name(), " --help"));
  }
  return absl::OkStatus();
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"atoll: DiLoCo and Streaming DiLoCo training across islands"};
  app.set_version_flag("--version", [] { return VersionText(); }, "version, commit, libtorch, "
                       "where the codecs run");
  app.require_subcommand(1);
  CommandLine cl;
  cl.argc = argc;
  cl.argv = argv;
  std::vector<Command> commands = {AddTrain(app, cl),   AddCoordinator(app, cl), AddSyncServer(app, cl),
                                   AddIsland(app, cl),  AddLocal(app, cl),
                                   AddCompare(app, cl), AddLoadtest(app, cl),
                                   AddPlan(app, cl)};
  for (auto& command : commands) command.app->footer(KeysHelp());
  for (auto* add : {AddExport, AddImport, AddGenerate, AddTokenizer, AddTokenize, AddReport}) commands.push_back(add(app, cl));
  for (auto& command : commands) command.app->allow_extras();
  if (absl::Status s = CheckCommandNames(app, argc, argv); !s.ok()) return Fail(s);
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
    if (absl::Status s = CheckOverrideNames(*command.app, *overrides); !s.ok()) return Fail(s);
    return command.run(*overrides);
  }
  return 0;
}

}  // namespace atl::cli

int main(int argc, char** argv) { return atl::cli::Main(argc, argv); }
