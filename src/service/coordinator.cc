#include "src/service/coordinator.h"

#include <malloc.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "compression/status_macros.h"
#include "outer/base/fragments.h"
#include "outer/service/service_options.h"
#include "src/store/atomic_file.h"
#include "src/net/grpc_transport.h"
#include "src/net/http_server.h"
#include "src/observe/metrics.h"
#include "src/observe/monitoring.h"
#include "src/net/rpc_security.h"
#include "src/observe/status_page.h"

namespace atl {

namespace {

constexpr const char* kStateFile = "service-state.pb";

// Writes the service state in its own thread every `every` commits (and once more when stopped),
// then tells the service which rounds are durable.
class StateWriter {
 public:
  StateWriter(outer::SyncServer* sync, std::string path, int every, FILE* out)
      : sync_(sync), path_(std::move(path)), every_(every), out_(out) {
    thread_ = std::thread([this] { Run(); });
  }
  ~StateWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Called by the commit listener (under the service's lock): only flags the work.
  void Committed() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++pending_;
    }
    cv_.notify_all();
  }
  double max_write_s() const { return max_write_s_; }
  int writes() const { return writes_; }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || pending_ >= every_; });
      const bool last = stop_;
      pending_ = 0;
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      if (auto state = WriteServiceState(path_, *sync_); !state.ok()) {
        std::fprintf(out_, "atoll coordinator: error: service state not written: %s\n",
                     std::string(state.status().message()).c_str());
      } else {
        sync_->MarkDurable(*state);
        ++writes_;
      }
      max_write_s_ = std::max(
          max_write_s_.load(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      lock.lock();
      if (last) return;
    }
  }

  outer::SyncServer* sync_;
  const std::string path_;
  const int every_;
  FILE* out_;
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  bool stop_ = false;
  std::atomic<double> max_write_s_{0};
  std::atomic<int> writes_{0};
  std::thread thread_;
};

// Where each island's tokens went since the previous commit of fragment 0 (the token ledger's
// slice; outer/service/token_ledger.h): summed over a run, the run's account.
nlohmann::json LedgerJson(const std::map<std::string, outer::TokenAccount>& ledger) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [island, a] : ledger) out[island] = TokenAccountJson(a);
  return out;
}

// The rounds.jsonl record of a committed round.
nlohmann::json RoundRecord(const outer::CommittedRound& r, double wall) {
  nlohmann::json record = {{"round", r.round},
                           {"fragment", r.fragment},
                           {"contributors", r.contributors},
                           {"tokens", r.tokens},
                           {"staleness", r.staleness},
                           {"relative_norms", r.relative_norms},
                           {"params_hash", absl::StrFormat("%016x", r.params_hash)},
                           {"commit_s", r.commit_s},
                           {"wall_s", wall}};
  if (!r.dropped.empty()) record["dropped"] = r.dropped;
  if (!r.voided.empty()) record["voided"] = r.voided;  // contributions of no work
  if (!r.progress) record["progress"] = false;         // a zero update
  if (r.grace_s >= 0) record["grace_s"] = r.grace_s;
  if (!r.stale_contributors.empty()) {
    record["stale_contributors"] = r.stale_contributors;  // late: made for an earlier round
    record["stale_tokens"] = r.stale_tokens;
  }
  if (!r.ledger.empty()) record["ledger"] = LedgerJson(r.ledger);
  if (!r.range_hashes.empty()) {
    nlohmann::json ranges = nlohmann::json::object();
    for (const auto& [range, hash] : r.range_hashes) {
      ranges[absl::StrCat(range.first, "-", range.second)] = absl::StrFormat("%016x", hash);
    }
    record["range_hashes"] = ranges;
  }
  if (!r.aggregation.clipped.empty()) record["clipped"] = r.aggregation.clipped;
  if (!r.aggregation.trimmed.empty()) record["trimmed"] = r.aggregation.trimmed;
  if (!r.aggregation.outliers.empty()) record["outliers"] = r.aggregation.outliers;
  if (!r.aggregation.copies.groups.empty()) record["copies"] = r.aggregation.copies.groups;
  if (r.aggregation.scores.scored()) {
    nlohmann::json scores = nlohmann::json::object();
    for (const auto& [island, score] : r.aggregation.scores.islands) {
      scores[island] = {{"improvement", score.improvement},
                        {"t", score.t},
                        {"score", score.score},
                        {"reputation", score.reputation},
                        {"weight", score.excluded ? 0.0 : score.weight},
                        {"excluded", score.excluded},
                        {"harmful", score.harmful},
                        {"loo_gain", score.loo_gain},
                        {"loo_t", score.loo_t},
                        {"loo_evidence", score.loo_evidence}};
    }
    record["scores"] = scores;
    record["probe_loss"] = r.aggregation.scores.loss;
    if (r.aggregation.scores.step_loss > 0) {
      record["probe_average_loss"] = r.aggregation.scores.average_loss;
      record["probe_step_loss"] = r.aggregation.scores.step_loss;
      record["step_guarded"] = r.aggregation.scores.step_guarded;
    }
    record["probe_s"] = r.aggregation.scores.seconds;
    record["probe_median_t"] = r.aggregation.scores.median_t;
  }
  if (r.aggregation.copies.most_similar > 0) {
    record["copy_similarity"] = r.aggregation.copies.most_similar;
  }
  return record;
}

// The HTTP endpoints of the coordinator: metrics and/or the status page, as asked.
absl::StatusOr<std::vector<std::unique_ptr<HttpServer>>> StartHttp(const CoordinatorOptions& options,
                                                                   ServiceMonitor& monitor) {
  std::vector<std::unique_ptr<HttpServer>> servers;
  const HttpAccess access{options.http_token, {"/healthz", "/readyz"}};
  auto metrics = [&monitor] {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", monitor.PrometheusText()};
  };
  if (!options.metrics_listen.empty()) {
    ATL_ASSIGN_OR_RETURN(auto server, HttpServer::Start(options.metrics_listen,
                                                        {{"/metrics", metrics}}, access));
    std::fprintf(options.out, "atoll coordinator: metrics on http://%s/metrics\n",
                 server->address().c_str());
    servers.push_back(std::move(server));
  }
  if (!options.http_listen.empty()) {
    auto ok = [] { return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}; };
    auto server = HttpServer::Start(
        options.http_listen,
        {{"/", [] { return HttpResponse{200, "text/html; charset=utf-8", StatusPageHtml()}; }},
         {"/api/status",
          [&monitor] { return HttpResponse{200, "application/json", monitor.StatusJson()}; }},
         {"/metrics", metrics},
         {"/healthz", ok},
         {"/readyz", ok}},  // served once the gRPC services listen
        access);
    if (!server.ok()) return server.status();
    std::fprintf(options.out, "atoll coordinator: status page on http://%s/\n",
                 (*server)->address().c_str());
    servers.push_back(*std::move(server));
  }
  std::fflush(options.out);
  return servers;
}

// A shard server's link to the run's coordinator: one long poll after another, in its own thread,
// each reporting the shard's rounds and the islands it heard from and mirroring the membership it
// is answered.
class ShardLink {
 public:
  ShardLink(outer::SyncServer* sync, std::unique_ptr<GrpcTransport> coordinator,
            std::string address, std::string name, FILE* out)
      : sync_(sync),
        coordinator_(std::move(coordinator)),
        address_(std::move(address)),
        name_(std::move(name)),
        out_(out) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ShardLink() {
    stop_ = true;
    thread_.join();
  }
  // A refusal that ends the shard (another run, model or shard count): OK while there is none.
  absl::Status fatal() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fatal_;
  }
  // Seconds since the coordinator last answered (since the link started, before its first answer).
  double silent_s() const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_answer_).count();
  }

 private:
  void Run() {
    bool failing = false, reached = false;
    while (!stop_) {
      auto view = coordinator_->ShardSync(sync_->ShardReport(address_));
      if (view.ok()) {
        sync_->MirrorMembership(*view);
        std::lock_guard<std::mutex> lock(mu_);
        last_answer_ = std::chrono::steady_clock::now();
        if (!reached || failing) {
          std::fprintf(out_, "%s: reached the coordinator; serving islands at %s\n",
                       name_.c_str(), address_.c_str());
          std::fflush(out_);
        }
        reached = true;
        failing = false;
        continue;
      }
      const absl::Status& s = view.status();
      if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s) || absl::IsInvalidArgument(s) ||
          absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s)) {
        std::lock_guard<std::mutex> lock(mu_);
        fatal_ = absl::Status(s.code(), absl::StrCat("the coordinator refused this shard: ",
                                                     s.message()));
        return;
      }
      if (!failing) {
        std::fprintf(out_, "%s: cannot reach the coordinator (%s); retrying\n", name_.c_str(),
                     std::string(s.message()).c_str());
        std::fflush(out_);
      }
      failing = true;
      for (int i = 0; i < 4 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  outer::SyncServer* sync_;
  std::unique_ptr<GrpcTransport> coordinator_;
  const std::string address_, name_;
  FILE* out_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  absl::Status fatal_;
  std::chrono::steady_clock::time_point last_answer_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

// ", warm start 50 steps, H = 10 for 200 steps" (empty without early phases).
std::string PhasesText(const outer::SyncPhases& p) {
  std::string text;
  if (p.warm_start_steps > 0) text += absl::StrFormat(", warm start %d steps", p.warm_start_steps);
  if (p.early_sync_every > 0) {
    text += absl::StrFormat(", H = %d for %d steps", p.early_sync_every, p.early_sync_steps);
  }
  return text;
}

// The rounds the service commits (a shard: those of its fragments): one per due step of the
// schedule, plus a final one at the last step for each fragment that is not due there.
uint64_t TotalRounds(const Config& config, const outer::SyncServerOptions& o) {
  const outer::SyncSchedule schedule(config.outer.sync_every, config.outer.num_fragments,
                                     config.outer.phases);
  // The coordinator of a sharded run counts every fragment's rounds (as the shards report them).
  auto count = [&](const std::vector<uint32_t>& due) {
    return uint64_t(std::count_if(due.begin(), due.end(), [&](uint32_t f) {
      return o.shard == outer::SyncServerOptions::kControlPlane || outer::ShardOwns(o, f);
    }));
  };
  uint64_t total = 0;
  for (int64_t t = 1; t <= config.train.steps; ++t) total += count(schedule.DueAfter(t));
  std::vector<uint32_t> all(size_t(config.outer.num_fragments));
  std::iota(all.begin(), all.end(), 0u);
  return total + count(all) - count(schedule.DueAfter(config.train.steps));
}

// A resumed service drops from rounds.jsonl the rounds logged but not durable: they are redone.
// The records kept.
absl::StatusOr<std::vector<std::string>> TrimRoundsLog(const std::string& run_dir,
                                                       const pb::ServiceState& state) {
  const std::string log_path = run_dir + "/rounds.jsonl";
  std::ifstream in(log_path);
  std::vector<std::string> kept;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("round")) continue;
    const uint32_t f = j.value("fragment", 0u);
    for (const auto& fs : state.fragments()) {
      if (fs.fragment() == f && j["round"].get<uint64_t>() < fs.round()) kept.push_back(line);
    }
  }
  in.close();
  std::string text;
  for (const auto& line : kept) text += line + "\n";
  ATL_RETURN_IF_ERROR(WriteFileAtomic(log_path, text));
  return kept;
}

// What `RunCoordinator` checks before it builds or binds anything.
absl::Status CheckOptions(const Config& config, const CoordinatorOptions& options) {
  for (const auto& [flag, address] : {std::pair{"--metrics-listen", &options.metrics_listen},
                                      std::pair{"--http-listen", &options.http_listen}}) {
    if (address->empty()) continue;
    if (auto s = CheckListenAddress(*address); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
    }
  }
  if (options.shard >= 0 && (options.shard >= config.outer.shards || options.coordinator.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options.shard, " of a run of outer.shards = ", config.outer.shards,
        options.coordinator.empty() ? " needs the coordinator's address" : " does not exist"));
  }
  if (options.resume && options.run_dir.empty()) {
    return absl::InvalidArgumentError("--resume needs the run directory");
  }
  return absl::OkStatus();
}

// The line printed for the n-th round (version) this service committed. A sync round is named by
// its id, as rounds.jsonl, the islands and the status page name it ("round 0" is the first);
// "(n/N)" counts the commits.
std::string CommitLine(const Config& config, const outer::CommittedRound& r, uint64_t n,
                       uint64_t total_rounds, double wall) {
  const bool fragments = config.outer.num_fragments > 1;
  if (config.outer.async()) {
    return absl::StrFormat(
        "version %d applied%s: %s, staleness %d, %d tokens, params %016x, %.1fs", n,
        fragments ? absl::StrFormat(" (fragment %d, its version %d)", r.fragment, r.round + 1) : "",
        absl::StrJoin(r.contributors, "+"), r.staleness, r.tokens, r.params_hash, wall);
  }
  return absl::StrFormat(
      "%sround %d committed (%d/%d): %s, %d tokens, params %016x, %.1fs",
      fragments ? absl::StrFormat("fragment %d ", r.fragment) : "", r.round, n, total_rounds,
      absl::StrCat(absl::StrJoin(r.contributors, "+"),
                   r.stale_contributors.empty()
                       ? ""
                       : absl::StrCat(" (late: ", absl::StrJoin(r.stale_contributors, "+"), ")")),
      r.tokens, r.params_hash, wall);
}

// Serves until stopped, or until the service's rounds are done and no island is left (a shard:
// or the coordinator has gone, which it does once the last island left); a shard the coordinator
// refuses ends with that refusal.
absl::Status ServeUntilDone(const Config& config, const CoordinatorOptions& options,
                            uint64_t total_rounds, outer::SyncServer& sync, ShardLink* link,
                            ServiceMonitor& monitor) {
  uint64_t trimmed_at = sync.committed_rounds();
  for (int tick = 0; options.stop == nullptr || !options.stop->load(); ++tick) {
    const uint64_t committed = sync.committed_rounds();
    const bool by_tokens = config.outer.async() || config.outer.run_end == outer::RunEnd::kTokens;
    const bool done = by_tokens ? sync.budget_reached() : committed >= total_rounds;
    // A round's pushes arrive on many threads in gRPC's small buffers, which glibc keeps in
    // per-thread heaps between the big blocks that stay: once a round has committed, the free
    // pages go back to the system.
    if (committed != trimmed_at) {
      trimmed_at = committed;
      malloc_trim(0);
    }
    if (done && (sync.num_members() == 0 || (link && link->silent_s() > 3))) break;
    if (link && !link->fatal().ok()) return link->fatal();
    if (tick % 10 == 0) monitor.Sample();  // curves and bandwidth, once a second
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::OkStatus();
}

// What makes the service durable: the state restored on a resume, then the state writer and the
// rounds log (none without a run directory, and none on the coordinator of a sharded run, which
// holds no outer state: islands rejoin a restarted one; each shard writes its own). The resolved
// config is written beside them.
struct Durability {
  std::string state_path;
  std::unique_ptr<MetricsLog> rounds_log;
  std::unique_ptr<StateWriter> writer;
  std::vector<std::string> logged_rounds;  // a resumed run's rounds.jsonl records, kept
};

absl::StatusOr<Durability> OpenDurability(const Config& config, const CoordinatorOptions& options,
                                          const std::string& who, outer::SyncServer& sync) {
  Durability d;
  if (options.run_dir.empty()) return d;
  if (!sync.is_control_plane()) d.state_path = (std::filesystem::path(options.run_dir) / kStateFile).string();
  if (options.resume && !d.state_path.empty()) {
    ATL_ASSIGN_OR_RETURN(auto state, RestoreServiceState(d.state_path, sync));
    ATL_ASSIGN_OR_RETURN(d.logged_rounds, TrimRoundsLog(options.run_dir, state));
    std::fprintf(options.out, "%s: resumed run '%s' at round %llu from %s\n", who.c_str(),
                 config.outer.run_id.c_str(), (unsigned long long)sync.committed_rounds(),
                 d.state_path.c_str());
  }
  // The resolved config beside the state: tools read the state with it (atoll export).
  std::error_code ec;
  std::filesystem::create_directories(options.run_dir, ec);
  ATL_RETURN_IF_ERROR(WriteFileAtomic(options.run_dir + "/config.toml", ToToml(config)));
  if (d.state_path.empty()) return d;
  ATL_ASSIGN_OR_RETURN(d.rounds_log, MetricsLog::Open(options.run_dir + "/rounds.jsonl", -1));
  // Writing every round, a round is handed out only once durable: a crash loses nothing any
  // island has applied. Writing less often, up to durable_every - 1 rounds can be redone.
  sync.SetDurabilityGate(config.outer.durable_every == 1);
  d.writer = std::make_unique<StateWriter>(&sync, d.state_path, config.outer.durable_every,
                                           options.out);
  return d;
}

// A shard server's link to its run's coordinator (none for the coordinator itself).
absl::StatusOr<std::unique_ptr<ShardLink>> LinkToCoordinator(const CoordinatorOptions& options,
                                                             outer::SyncServer& sync,
                                                             const std::string& address,
                                                             const std::string& who) {
  if (options.shard < 0) return std::unique_ptr<ShardLink>();
  GrpcTransportOptions t;
  t.target = options.coordinator;
  t.token = options.shard_token;
  t.tls = options.server.tls;
  t.rpc_timeout_s = 4;  // a long poll answers within a second
  ATL_ASSIGN_OR_RETURN(auto coordinator, GrpcTransport::Create(t));
  return std::make_unique<ShardLink>(&sync, std::move(coordinator),
                                     options.advertise.empty() ? address : options.advertise, who,
                                     options.out);
}

void SayStopped(const outer::SyncServer& sync, const std::string& who, FILE* out) {
  std::string hashes;
  for (uint32_t f = 0; f < sync.num_fragments(); ++f) {
    if (!outer::ShardOwns(sync.options(), f)) continue;
    hashes += absl::StrFormat("%s%016x", hashes.empty() ? "" : " ", sync.params_hash(f));
  }
  std::fprintf(out, "%s: stopped after %llu rounds%s\n", who.c_str(),
               (unsigned long long)sync.committed_rounds(),
               hashes.empty() ? "" : absl::StrCat(", global params ", hashes).c_str());
  std::fflush(out);
}

// What each commit tells: the monitor, the console (the warm start's one-step rounds, but its
// last, a line every 2 s), the state writer, rounds.jsonl and the embedding caller. Fragments
// commit on several threads.
class CommitReports {
 public:
  CommitReports(const Config& config, const CoordinatorOptions& options, uint64_t total_rounds,
                uint64_t committed, ServiceMonitor& monitor, Durability& durable)
      : config_(config), options_(options), total_rounds_(total_rounds), committed_(committed),
        monitor_(monitor), durable_(durable) {}

  void OnCommit(const outer::CommittedRound& r) {
    monitor_.OnCommit(r);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const uint64_t n = committed_.fetch_add(1) + 1;
    const bool quick =
        !config_.outer.async() && config_.outer.phases.QuickRound(r.round) && n < total_rounds_;
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto more = round_lines_.Take(quick, wall)) {
      std::fprintf(options_.out, "%s%s\n", CommitLine(config_, r, n, total_rounds_, wall).c_str(),
                   more->c_str());
      std::fflush(options_.out);
    }
    if (durable_.writer) durable_.writer->Committed();
    if (durable_.rounds_log || options_.on_round) {
      const nlohmann::json record = RoundRecord(r, wall);
      if (durable_.rounds_log) durable_.rounds_log->Write(record);
      if (options_.on_round) options_.on_round(record.dump());
    }
  }

 private:
  const Config& config_;
  const CoordinatorOptions& options_;
  const uint64_t total_rounds_;
  std::atomic<uint64_t> committed_;  // > 0 after a resume
  ServiceMonitor& monitor_;
  Durability& durable_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  RoundLines round_lines_{2.0};
};

}  // namespace

// "atoll coordinator: run 'atoll' listening on ADDRESS (...)", and what a newcomer would wonder
// about: where the parameters came from, why the first rounds come so fast.
void SayListening(FILE* out, const std::string& who, const Config& config,
                  const std::string& address, uint64_t total_rounds, uint64_t token_budget,
                  bool fresh) {
  const std::string plan =
      config.outer.async()
          ? absl::StrFormat("async, %d tokens", token_budget)
          : absl::StrFormat("%d rounds", total_rounds) + PhasesText(config.outer.phases);
  std::fprintf(
      out, "%s: run '%s' listening on %s (%d islands, H = %d, %s%s)%s\n", who.c_str(),
      config.outer.run_id.c_str(), address.c_str(), config.outer.islands,
      config.outer.sync_every, plan.c_str(),
      config.outer.shards > 1 ? absl::StrFormat(", %d shards", config.outer.shards).c_str() : "",
      config.train.init_from.empty()
          ? ""
          : absl::StrCat("; global parameters from train.init_from = ", config.train.init_from).c_str());
  if (config.outer.phases.warm_start_steps > 0 && fresh) {
    std::fprintf(out,
                 config.outer.async()
                     ? "%s: the warm start: each island pushes each of its first %d steps (its "
                       "share of a plain average, outer.warm_start_steps)\n"
                     : "%s: the warm start's first %d steps are rounds of one step each (plain "
                       "averages, outer.warm_start_steps); their lines come every 2 s\n",
                 who.c_str(), int(config.outer.phases.warm_start_steps));
  }
}

absl::Status RunCoordinator(const Config& config, const CoordinatorOptions& options) {
  // Pushes arrive as many 1 MiB chunks on many threads. With glibc's adaptive threshold those land
  // in per-thread heaps that keep what they free (measured: a 494M-parameter service grew by 2.3
  // GiB over three rounds); above a fixed threshold every such buffer is mapped on its own and
  // goes back to the system when freed.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  const bool shard = options.shard >= 0;
  const std::string who =
      shard ? absl::StrCat("atoll sync-server (shard ", options.shard, "/", config.outer.shards, ")")
            : std::string("atoll coordinator");
  // Flags are checked before anything is built or bound.
  ATL_RETURN_IF_ERROR(CheckOptions(config, options));
  Config initial = config;
  if (options.resume) initial.train.init_from.clear();  // the state file holds the parameters
  const int shard_index = shard ? options.shard : outer::SyncServerOptions::kControlPlane;
  ATL_ASSIGN_OR_RETURN(auto sync, options.make_sync
                                      ? options.make_sync(initial, shard_index)
                                      : MakeModuleSyncServer(initial, shard_index, options.module));
  ATL_ASSIGN_OR_RETURN(Durability durable, OpenDurability(config, options, who, *sync));
  const uint64_t total_rounds = TotalRounds(config, sync->options());
  TrafficCounters traffic;
  ServiceMonitor monitor(*sync, &traffic,
                         RunFacts{config.outer.run_id, config.outer.async(), config.outer.islands,
                                  config.outer.sync_every, config.outer.num_fragments, total_rounds,
                                  config.train.steps});
  monitor.Resume(durable.logged_rounds);  // the status page's timeline goes on where it was
  CommitReports reports(config, options, total_rounds, sync->committed_rounds(), monitor, durable);
  sync->SetCommitListener([&](const outer::CommittedRound& r) { reports.OnCommit(r); });
  sync->SetEventListener([&](const std::string& line) {
    std::fprintf(options.out, "%s\n", line.c_str());
    std::fflush(options.out);
  });
  GrpcServerOptions server_options = options.server;
  server_options.stream_idle_timeout_s = config.outer.stream_idle_timeout_s;
  server_options.stream_first_message_s = config.outer.stream_first_message_s;
  server_options.max_pending_calls = config.outer.max_pending_calls;
  server_options.max_calls_per_island = config.outer.max_calls_per_island;
  server_options.traffic = &traffic;
  ATL_ASSIGN_OR_RETURN(auto server, GrpcServer::Start(sync.get(), server_options));
  ATL_ASSIGN_OR_RETURN(auto link, LinkToCoordinator(options, *sync, server->address(), who));
  SayListening(options.out, who, config, server->address(), total_rounds,
               sync->options().token_budget, /*fresh=*/sync->committed_rounds() == 0);
  std::fflush(options.out);
  ATL_ASSIGN_OR_RETURN(auto http, StartHttp(options, monitor));
  if (options.on_serving) options.on_serving(server->address(), *sync);
  const absl::Status ended = ServeUntilDone(config, options, total_rounds, *sync, link.get(), monitor);
  link.reset();
  http.clear();
  server->Shutdown();
  if (options.on_stopped) options.on_stopped(*sync);
  if (durable.writer) {
    const int writes = durable.writer->writes();
    const double slowest = durable.writer->max_write_s();
    durable.writer.reset();  // the final state is durable before the coordinator says it stopped
    std::fprintf(options.out, "%s: service state written %d times, slowest %.1f ms\n", who.c_str(),
                 writes + 1, 1e3 * slowest);
  }
  if (!ended.ok()) return ended;
  SayStopped(*sync, who, options.out);
  return absl::OkStatus();
}

}  // namespace atl
