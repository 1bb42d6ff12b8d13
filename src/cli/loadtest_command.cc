#include "src/cli/loadtest_command.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "inner/model.h"
#include "outer/service/credentials.h"
#include "outer/service/service_options.h"
#include "outer/base/outer_config.h"
#include "outer/base/payload.h"
#include "src/store/atomic_file.h"
#include "src/cli/child_process.h"
#include "src/cli/synthetic_island.h"
#include "src/store/flat_params.h"
#include "src/observe/metrics.h"
#include "src/net/rpc_security.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
namespace pb = ::atollpb::v1;
using Clock = LoadClock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

std::string Gib(double bytes) { return absl::StrFormat("%.2f GiB", bytes / double(1 << 30)); }


bool Overridden(const std::vector<Override>& overrides, const std::string& key) {
  return std::any_of(overrides.begin(), overrides.end(),
                     [&](const Override& o) { return o.first == key; });
}

// The run's config: the user's, with the model sized to the parameters asked for, M islands that
// must all contribute, and R rounds of H steps.
absl::StatusOr<Config> LoadtestConfig(const LoadtestOptions& o) {
  // The coordinator reads no data; a run's config names some all the same.
  std::vector<Override> overrides = {{"data.path", "none (load test: nothing is trained)"}};
  overrides.insert(overrides.end(), o.overrides.begin(), o.overrides.end());
  ATL_ASSIGN_OR_RETURN(auto loaded, LoadConfig(o.config_path, overrides));
  Config c = loaded;
  const inner::ModelConfig sized = ModelForParams(o.params);
  c.model.n_layer = sized.n_layer;
  c.model.d_model = sized.d_model;
  c.model.n_head = sized.n_head;
  c.model.context = sized.context;
  c.outer.islands = o.islands;
  c.outer.mode = outer::OuterMode::kSync;
  if (!Overridden(o.overrides, "outer.min_islands")) c.outer.min_islands = o.islands;
  // Without a durable state write each round (4 bytes x 2 per parameter) the test measures the
  // service; --outer.durable_every=1 measures it with durability (updates wait for the write).
  if (!Overridden(o.overrides, "outer.durable_every")) c.outer.durable_every = o.rounds + 1;
  c.train.steps = int64_t(o.rounds) * c.outer.sync_every;
  // Every fragment is pushed every round. A sharded service holds one fragment per shard unless
  // more are asked for.
  c.outer.shards = o.shards;
  if (!Overridden(o.overrides, "outer.num_fragments")) {
    c.outer.num_fragments = std::max(c.outer.num_fragments, o.shards);
  }
  ATL_RETURN_IF_ERROR(inner::Validate(c.model));
  ATL_RETURN_IF_ERROR(outer::Validate(c.outer));
  return c;
}

absl::Status CheckOptions(const LoadtestOptions& o) {
  if (o.params < 10'000 || o.params > 100'000'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--params must be between 10000 and 1e11, got ", o.params));
  }
  if (o.islands < 1 || o.islands > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--islands must be 1 to 64, got ", o.islands));
  }
  if (o.rounds < 1 || o.rounds > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("--rounds must be 1 to 1000, got ", o.rounds));
  }
  if (o.shards < 1 || o.shards > 16) {
    return absl::InvalidArgumentError(absl::StrCat("--shards must be 1 to 16, got ", o.shards));
  }
  if (o.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  return absl::OkStatus();
}

// Sorts the heartbeats of every island into those that overlapped a commit and the others.
void SummarizeHeartbeats(const std::vector<Beat>& beats,
                         const std::vector<std::pair<Clock::time_point, Clock::time_point>>& commits,
                         LoadtestReport& report) {
  std::vector<double> all, during;
  for (const Beat& b : beats) {
    const double ms = 1e3 * b.latency_s;
    all.push_back(ms);
    const auto end = b.sent + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(b.latency_s));
    for (const auto& [from, to] : commits) {
      if (b.sent < to && end > from) {
        during.push_back(ms);
        break;
      }
    }
  }
  report.heartbeats = int(all.size());
  report.commit_heartbeats = int(during.size());
  report.heartbeat_p50_ms = Percentile(all, 0.5);
  report.heartbeat_p99_ms = Percentile(all, 0.99);
  report.heartbeat_max_ms = all.empty() ? 0 : *std::max_element(all.begin(), all.end());
  report.commit_heartbeat_p99_ms = Percentile(during, 0.99);
}

// Per round, the longest commit_s of the round's records in the service processes' rounds.jsonl
// (the coordinator's, or each shard server's): the service's own commit time.
std::vector<double> ServiceCommitSeconds(const std::string& run_dir) {
  std::map<uint64_t, double> by_round;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    std::ifstream in(entry.path() / "rounds.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("round") || !j.contains("commit_s")) continue;
      double& s = by_round[j["round"].get<uint64_t>()];
      s = std::max(s, j["commit_s"].get<double>());
    }
  }
  std::vector<double> out;
  for (const auto& [round, s] : by_round) out.push_back(s);
  return out;
}

void PrintReport(const LoadtestReport& r, FILE* out) {
  auto max_of = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  std::fprintf(out, "commit time (last chunk pushed -> first update chunk): median %.3f s, max %.3f s\n",
               Percentile(r.commit_s, 0.5), max_of(r.commit_s));
  if (!r.service_commit_s.empty()) {
    std::fprintf(out,
                 "service commit (aggregation, outer step, encoding, hashing): median %.3f s, "
                 "max %.3f s\n",
                 Percentile(r.service_commit_s, 0.5), max_of(r.service_commit_s));
  }
  const double budget = 3.5 * r.model_bytes + r.islands * r.contribution_bytes;
  if (r.shards <= 1) {
    std::fprintf(out,
                 "service peak RSS %s = %.2f x the fp32 model (%s); budget 3.5 x model + %d "
                 "contributions of %s = %s: %s\n",
                 Gib(double(r.rss_peak)).c_str(), double(r.rss_peak) / r.model_bytes,
                 Gib(r.model_bytes).c_str(), r.islands, Gib(r.contribution_bytes).c_str(),
                 Gib(budget).c_str(), double(r.rss_peak) <= budget ? "within" : "OVER");
  } else {
    std::string each;
    for (size_t k = 0; k < r.shard_rss_peak.size(); ++k) {
      each += absl::StrFormat("%sshard %d %s (%.2f x the model)", k ? ", " : "", k,
                              Gib(double(r.shard_rss_peak[k])).c_str(),
                              double(r.shard_rss_peak[k]) / r.model_bytes);
    }
    std::fprintf(out,
                 "service peak RSS per shard: %s; the fp32 model %s, one service's budget 3.5 x "
                 "model + %d contributions of %s = %s; coordinator (membership only) %s\n",
                 each.c_str(), Gib(r.model_bytes).c_str(), r.islands,
                 Gib(r.contribution_bytes).c_str(), Gib(budget).c_str(),
                 Gib(double(r.coordinator_rss_peak)).c_str());
  }
  std::fprintf(out,
               "heartbeats: %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d while a round was "
               "committed, their p99 %.1f ms\n",
               r.heartbeats, r.heartbeat_p50_ms, r.heartbeat_p99_ms, r.heartbeat_max_ms,
               r.commit_heartbeats, r.commit_heartbeat_p99_ms);
  std::fprintf(out, "goodput: pushes %.1f MB/s (encoded, all islands), rounds %.1f MB/s (pushed + "
               "received); wall %.1f s\n",
               r.push_goodput / 1e6, r.round_goodput / 1e6, r.wall_s);
  std::fflush(out);
}

nlohmann::json ToJson(const LoadtestReport& r) {
  return {{"params", r.params},
          {"codec", r.codec},
          {"islands", r.islands},
          {"rounds", r.rounds},
          {"service_threads", r.service_threads},
          {"model_bytes", r.model_bytes},
          {"contribution_bytes", r.contribution_bytes},
          {"rss_start", r.rss_start},
          {"rss_peak", r.rss_peak},
          {"push_s", r.push_s},
          {"commit_s", r.commit_s},
          {"service_commit_s", r.service_commit_s},
          {"round_s", r.round_s},
          {"heartbeats", r.heartbeats},
          {"heartbeat_p50_ms", r.heartbeat_p50_ms},
          {"heartbeat_p99_ms", r.heartbeat_p99_ms},
          {"heartbeat_max_ms", r.heartbeat_max_ms},
          {"commit_heartbeats", r.commit_heartbeats},
          {"commit_heartbeat_p99_ms", r.commit_heartbeat_p99_ms},
          {"push_goodput", r.push_goodput},
          {"round_goodput", r.round_goodput},
          {"wall_s", r.wall_s},
          {"shards", r.shards},
          {"shard_rss_peak", r.shard_rss_peak},
          {"coordinator_rss_peak", r.coordinator_rss_peak}};
}

}  // namespace

inner::ModelConfig ModelForParams(int64_t params) {
  inner::ModelConfig m;
  m.context = 128;
  m.vocab = 256;
  // Wide enough for about 4 blocks of 12 d^2 parameters, a multiple of the head size 64.
  m.d_model = 64 * std::max<int>(1, int(std::sqrt(double(params) / 48.0) / 64.0));
  m.n_head = m.d_model / 64;
  const double d = m.d_model;
  const double per_block = 12 * d * d + 13 * d;
  const double outside = 2.0 * m.vocab * d + m.context * d + 2 * d;
  m.n_layer = std::max(1, int(std::lround((double(params) - outside) / per_block)));
  return m;
}

// The service under test: the coordinator and, for a sharded service, its shard servers, each a
// process of its own started from this program.
class ServiceProcesses {
 public:
  absl::Status Start(const LoadtestOptions& o, const std::string& config_path,
                     const std::string& token) {
    setenv(kTokenEnv, token.c_str(), 1);
    setenv(kShardTokenEnv, outer::NewCredential().c_str(), 1);
    auto start = [&](std::vector<std::string> argv, const std::string& name) {
      processes_.push_back(std::make_unique<ChildProcess>(
          std::move(argv), (fs::path(o.run_dir) / (name + ".log")).string()));
      names_.push_back(name);
    };
    start({o.binary, "coordinator", "--config", config_path, "--listen", "127.0.0.1:0", "--run-dir",
           (fs::path(o.run_dir) / "coordinator").string()},
          "coordinator");
    ATL_ASSIGN_OR_RETURN(auto address, Address(0, o.run_dir));
    address_ = address;
    for (int k = 0; o.shards > 1 && k < o.shards; ++k) {
      const std::string name = absl::StrCat("shard-", k);
      start({o.binary, "sync-server", "--shard", absl::StrCat(k, "/", o.shards), "--coordinator",
             address_, "--config", config_path, "--listen", "127.0.0.1:0", "--run-dir",
             (fs::path(o.run_dir) / name).string()},
            name);
    }
    unsetenv(kTokenEnv);
    unsetenv(kShardTokenEnv);
    for (size_t k = 1; k < processes_.size(); ++k) {
      const std::string log = processes_[k]->WaitForOutput("reached the coordinator", 600);
      if (log.find("reached the coordinator") == std::string::npos) {
        return absl::InternalError(absl::StrCat(names_[k], " did not start; see ", o.run_dir, "/",
                                                names_[k], ".log:\n", log.substr(0, 2000)));
      }
    }
    return absl::OkStatus();
  }
  const std::string& address() const { return address_; }
  // The processes that hold outer state: the coordinator, or the shards of a sharded service.
  std::vector<ChildProcess*> holders() const {
    std::vector<ChildProcess*> out;
    for (size_t k = processes_.size() > 1 ? 1 : 0; k < processes_.size(); ++k) {
      out.push_back(processes_[k].get());
    }
    return out;
  }
  ChildProcess& coordinator() { return *processes_[0]; }
  const std::string& name(const ChildProcess* p) const {
    for (size_t k = 0; k < processes_.size(); ++k) {
      if (processes_[k].get() == p) return names_[k];
    }
    return names_[0];
  }
  // Once the islands have left: each process is asked to end (its rounds are all committed; the
  // last state is written) and must end cleanly.
  absl::Status Stop(const std::string& run_dir) {
    for (size_t k = processes_.size(); k-- > 0;) {
      if (const int code = processes_[k]->Terminate(120); code != 0) {
        return absl::InternalError(absl::StrCat(names_[k], " ended with ", code, "; see ", run_dir,
                                                "/", names_[k], ".log"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::string> Address(size_t k, const std::string& run_dir) {
    const std::string log = processes_[k]->WaitForOutput("listening on ", 600);
    const auto at = log.find("listening on ");
    if (at == std::string::npos) {
      return absl::InternalError(absl::StrCat("the ", names_[k], " did not start; see ", run_dir,
                                              "/", names_[k], ".log:\n", log.substr(0, 2000)));
    }
    return log.substr(at + 13, log.find(' ', at + 13) - at - 13);
  }

  std::vector<std::unique_ptr<ChildProcess>> processes_;
  std::vector<std::string> names_;
  std::string address_;
};

namespace {

// The report's figures of the run before it starts, said.
LoadtestReport StartReport(const LoadtestOptions& o, const Config& config) {
  LoadtestReport report;
  report.params = inner::ParameterCount(config.model);
  report.codec = compression::SpecText(config.outer.wire_codec());
  report.islands = o.islands;
  report.rounds = o.rounds;
  report.shards = o.shards;
  report.service_threads =
      config.outer.service_threads > 0 ? config.outer.service_threads : outer::UsableCores();
  report.model_bytes = 4.0 * double(report.params);
  std::fprintf(o.out,
               "atoll loadtest: %lld parameters (n_layer %d, d_model %d, %d fragment%s), %s, %d "
               "islands, %d rounds, %d service threads%s\n",
               (long long)report.params, config.model.n_layer, config.model.d_model,
               config.outer.num_fragments, config.outer.num_fragments == 1 ? "" : "s",
               report.codec.c_str(), o.islands, o.rounds, report.service_threads,
               o.shards > 1 ? absl::StrFormat(", %d shard servers", o.shards).c_str() : "");
  std::fflush(o.out);
  return report;
}

// The processes holding state and their resident memory, as one line's end.
std::string Resident(ServiceProcesses& service, const std::vector<ChildProcess*>& holders) {
  std::string resident;
  for (ChildProcess* p : holders) {
    resident += absl::StrCat(resident.empty() ? "" : ", ", service.name(p), " resident ",
                             Gib(double(p->RssBytes())));
  }
  return resident;
}

}  // namespace

absl::StatusOr<LoadtestReport> RunLoadtest(const LoadtestOptions& o) {
  ATL_RETURN_IF_ERROR(CheckOptions(o));
  // The simulated islands share the machine with the service under test, as real islands do not.
  // With glibc's defaults their gRPC reads land on freshly mapped pages every round (freed buffers
  // go back to the system), page faults that take the service's cores (measured: about 55,000 a
  // round of 8 islands at 494M parameters, int2 1%). This process keeps what it frees; the
  // service, a child process, keeps its own allocator settings.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  ATL_ASSIGN_OR_RETURN(auto loaded, LoadtestConfig(o));
  const Config config = loaded;
  std::error_code ec;
  fs::create_directories(o.run_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot create ", o.run_dir, ": ", ec.message()));
  // The service appends to its rounds.jsonl: an earlier load test's records would mix with
  // this one's commit times.
  for (const auto& entry : fs::directory_iterator(o.run_dir, ec)) {
    fs::remove(entry.path() / "rounds.jsonl", ec);
  }
  const std::string config_path = (fs::path(o.run_dir) / "config.toml").string();
  ATL_RETURN_IF_ERROR(WriteFileAtomic(config_path, ToToml(config)));
  LoadtestReport report = StartReport(o, config);

  const std::string token = outer::NewCredential();
  ServiceProcesses service;
  ATL_RETURN_IF_ERROR(service.Start(o, config_path, token));
  const auto holders = service.holders();
  report.rss_start = holders.front()->RssBytes();
  std::fprintf(o.out, "coordinator at %s (pid %d)", service.address().c_str(),
               service.coordinator().pid());
  for (ChildProcess* p : holders) {
    std::fprintf(o.out, "; %s resident %s once listening", service.name(p).c_str(),
                 Gib(double(p->RssBytes())).c_str());
  }
  std::fprintf(o.out, "\n");
  std::fflush(o.out);

  const auto start = Clock::now();
  ATL_ASSIGN_OR_RETURN(auto islands, SyntheticIslands::Join(config, o.islands, service.address(),
                                                            token, o.heartbeat_every_s));
  report.contribution_bytes = double(islands->contribution_bytes());

  std::vector<std::pair<Clock::time_point, Clock::time_point>> commits;
  double pushed = 0, moved = 0, push_time = 0, round_time = 0;
  ATL_RETURN_IF_ERROR(islands->RunRounds(o.rounds, o.stop, [&](int r, const RoundTimes& t) {
    commits.emplace_back(std::min(t.sent, t.first_update), std::max(t.sent, t.first_update));
    pushed += double(t.bytes_pushed);
    moved += double(t.bytes_pushed + t.bytes_received);
    report.push_s.push_back(Seconds(t.start, t.sent));
    report.commit_s.push_back(t.CommitSeconds());
    report.round_s.push_back(Seconds(t.start, t.done));
    push_time += report.push_s.back();
    round_time += report.round_s.back();
    std::fprintf(o.out, "round %d/%d: pushes %.2f s, commit %.3f s, whole round %.2f s, %s\n",
                 r + 1, o.rounds, report.push_s.back(), report.commit_s.back(),
                 report.round_s.back(), Resident(service, holders).c_str());
    std::fflush(o.out);
  }));
  // Peaks before the islands leave: the processes still run.
  for (ChildProcess* p : holders) report.shard_rss_peak.push_back(p->PeakRssBytes());
  report.rss_peak = *std::max_element(report.shard_rss_peak.begin(), report.shard_rss_peak.end());
  report.coordinator_rss_peak = service.coordinator().PeakRssBytes();
  report.wall_s = Seconds(start, Clock::now());
  ATL_RETURN_IF_ERROR(islands->Leave(o.run_dir + "/coordinator.log"));
  SummarizeHeartbeats(islands->Heartbeats(), commits, report);
  report.push_goodput = push_time > 0 ? pushed / push_time : 0;
  report.round_goodput = round_time > 0 ? moved / round_time : 0;
  ATL_RETURN_IF_ERROR(service.Stop(o.run_dir));
  report.service_commit_s = ServiceCommitSeconds(o.run_dir);
  PrintReport(report, o.out);
  ATL_RETURN_IF_ERROR(WriteFileAtomic((fs::path(o.run_dir) / "loadtest.json").string(),
                                      ToJson(report).dump(2) + "\n"));
  return report;
}

}  // namespace atl
