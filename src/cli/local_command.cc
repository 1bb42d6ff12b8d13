#include "src/cli/local_command.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compression/status_macros.h"
#include "outer/service/credentials.h"
#include "src/store/checkpoint.h"
#include "src/net/http_server.h"
#include "src/net/rpc_security.h"
#include "src/cli/local_children.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using local::Child;
using local::Describe;
using local::Drain;
using local::Reap;
using local::Spawn;

}  // namespace

absl::StatusOr<LocalEvent> ParseLocalEvent(LocalEvent::Kind kind, const std::string& text) {
  const char* flag = kind == LocalEvent::kKill   ? "--kill"
                     : kind == LocalEvent::kTerm ? "--term"
                     : kind == LocalEvent::kJoin ? "--join"
                                                 : "--stop";
  LocalEvent e;
  e.kind = kind;
  std::string at = text;
  if (kind == LocalEvent::kStop) {
    const std::vector<std::string> timed = absl::StrSplit(text, absl::MaxSplits(':', 1));
    if (timed.size() != 2 || !absl::SimpleAtod(timed[1], &e.seconds) || !(e.seconds > 0) ||
        e.seconds > 1e5) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " '", text, "': expected ISLAND@roundN:SECONDS, e.g. island1@round3:2.5"));
    }
    at = timed[0];
  }
  const std::vector<std::string> parts = absl::StrSplit(at, '@');
  uint64_t round = 0;
  if (parts.size() != 2 || parts[0].empty() || !absl::StartsWith(parts[1], "round") ||
      !absl::SimpleAtoi(parts[1].substr(5), &round)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", text,
                                                   "': expected ISLAND@roundN, e.g. island1@round3"));
  }
  e.round = round;
  std::string who = parts[0];
  if (const auto dot = who.rfind('.'); dot != std::string::npos) {
    if (!absl::SimpleAtoi(who.substr(dot + 1), &e.rank) || e.rank < 0 ||
        kind == LocalEvent::kJoin || kind == LocalEvent::kStop) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", text,
                                                     "': a rank is ISLAND.RANK, e.g. island1.0 "
                                                     "(--kill and --term only)"));
    }
    who.resize(dot);
  }
  int index;
  e.island = absl::SimpleAtoi(who, &index) ? absl::StrCat("island", index) : who;
  return e;
}

absl::StatusOr<std::vector<double>> ParseThrottles(const std::string& list, int islands) {
  std::vector<double> out(size_t(std::max(islands, 0)), 1.0);
  if (list.empty()) return out;
  const std::vector<std::string> parts = absl::StrSplit(list, ',');
  if (parts.size() > out.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--throttle lists ", parts.size(),
                                                   " factors for ", islands, " islands"));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    double v;
    if (!absl::SimpleAtod(parts[i], &v) || !(v >= 1) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--throttle factor '", parts[i], "' of island ", i, " is not a number >= 1"));
    }
    out[i] = v;
  }
  return out;
}

namespace {

// A coordinator and its islands as child processes: started, their output relayed and logged,
// scheduled events fired as rounds commit, and supervised until every one has ended.
class LocalRun {
 public:
  explicit LocalRun(const LocalOptions& options) : options_(options) {}
  absl::StatusOr<LocalSummary> Run();

 private:
  absl::Status Prepare();
  // Coordinator first; its first line names the address it bound. Then the shard servers of a
  // sharded run.
  absl::Status StartCoordinator();
  // A shard restarted by an event listens where it did and resumes from its durable state.
  absl::Status StartShard(int shard, const std::string& listen = "127.0.0.1:0", bool resume = false);
  // An island process. A name started before is restarted from its newest checkpoint (--resume);
  // without one it starts afresh in a directory of its own.
  absl::Status StartIsland(const std::string& name, double throttle);
  // --metrics-listen and --http-listen of the coordinator, as the user gave them.
  void AddCoordinatorMonitoring(std::vector<std::string>& argv) const;
  // The coordinator comes back at once on the same address, from its durable state.
  absl::Status RestartCoordinator();
  // Scheduled events fire when the coordinator reports the round they wait for.
  absl::Status FireEvents();
  absl::Status Fire(const LocalEvent& ev);
  // Relays and logs a child's line; notes its ranks' pids and the rounds committed.
  void OnLine(Child& c, const std::string& line);
  // Until every child's output has closed: relays, fires events, stops all on a failure.
  void Supervise();
  void CheckChildren();
  // Whether a child that ended failed the run.
  bool Failed(Child& c);
  // --chaos: the goodput report at the end (RUN_DIR/chaos.json).
  absl::Status ChaosReport();
  void Stop(absl::Status why);
  void StopAll(int sig);
  void WaitAll(double seconds);
  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  std::string RunPath(const std::string& name) const {
    return (fs::path(options_.run_dir) / name).string();
  }

  const LocalOptions& options_;
  std::string binary_, address_;
  int other_islands_ = 0;  // started under names other than island<i>
  std::vector<std::string> common_;  // arguments of every child: config and overrides
  Clock::time_point start_;
  std::vector<std::unique_ptr<Child>> children_;
  LocalSummary summary_;
  std::vector<bool> fired_;
  uint64_t committed_ = 0;                        // all together
  std::map<std::string, uint64_t> committed_by_;  // by the coordinator or shard that committed
  // Events waiting for the next commit, which shows the run has recovered from them.
  std::vector<std::pair<std::string, double>> recovering_;
  // --stop: islands to SIGCONT, and when.
  std::vector<std::pair<std::string, double>> paused_;
  absl::Status failure_;
  bool stopping_ = false;
  Clock::time_point islands_done_{};
  // --chaos
  class Target;
  std::unique_ptr<Target> chaos_target_;
  std::optional<Chaos> chaos_;
};

// The island processes, as a chaos run acts on them.
class LocalRun::Target final : public ChaosTarget {
 public:
  explicit Target(LocalRun& run) : run_(run) {}
  bool Running(const std::string& island) override { return Find(island) != nullptr; }
  void Signal(const std::string& island, int sig) override {
    Child* c = Find(island);
    if (c == nullptr) return;
    if (sig == SIGKILL) c->expected_end = true;
    for (const auto& [rank, pid] : c->rank_pids) kill(pid, sig);
    if (c->pid > 0) kill(c->pid, sig);
  }
  absl::Status Restart(const std::string& island) override { return run_.StartIsland(island, 1.0); }
  void Say(const std::string& line) override {
    std::fprintf(run_.options_.out, "atoll local: chaos: %s\n", line.c_str());
  }

 private:
  // Stopped (SIGSTOP) islands are found too: their process still runs.
  Child* Find(const std::string& island) {
    for (auto& c : run_.children_) {
      if (c->name == island && !c->exited && !c->expected_end) return c.get();
    }
    return nullptr;
  }
  LocalRun& run_;
};

absl::StatusOr<LocalSummary> LocalRun::Run() {
  ATL_RETURN_IF_ERROR(Prepare());
  start_ = Clock::now();
  ATL_RETURN_IF_ERROR(StartCoordinator());
  for (int k = 0; options_.shards > 1 && k < options_.shards; ++k) {
    if (auto s = StartShard(k); !s.ok()) {
      StopAll(SIGTERM);
      WaitAll(10);
      return s;
    }
  }
  for (int i = 0; i < options_.islands; ++i) {
    const double throttle = size_t(i) < options_.throttle.size() ? options_.throttle[size_t(i)] : 1.0;
    if (auto s = StartIsland(absl::StrCat("island", i), throttle); !s.ok()) {
      StopAll(SIGTERM);
      WaitAll(10);
      return s;
    }
  }
  fired_.assign(options_.events.size(), false);
  chaos_target_ = std::make_unique<Target>(*this);  // chaos' and --stop's hands on the islands
  if (options_.chaos) chaos_.emplace(*options_.chaos, options_.islands);
  Supervise();
  // Pipes closed: every child has ended or is about to.
  WaitAll(stopping_ ? 10 : 30);
  for (auto& c : children_) {
    if (Failed(*c) && failure_.ok() && c->is_island) {
      failure_ = absl::AbortedError(absl::StrCat(c->name, " ", Describe(c->status), "; see ",
                                                 options_.run_dir, "/", c->name, ".log"));
    }
  }
  summary_.wall_s = now_s();
  if (!failure_.ok()) return failure_;
  if (chaos_) ATL_RETURN_IF_ERROR(ChaosReport());
  return summary_;
}

absl::Status LocalRun::Prepare() {
  if (options_.islands < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--islands must be >= 1, got ", options_.islands));
  }
  if (options_.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  if (fs::exists(RunPath("coordinator"))) {
    return absl::AlreadyExistsError(
        absl::StrCat("run directory ", options_.run_dir, " already holds a run"));
  }
  binary_ = options_.atoll_binary;
  if (binary_.empty()) binary_ = fs::read_symlink("/proc/self/exe").string();
  std::error_code ec;
  fs::create_directories(options_.run_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", options_.run_dir));
  // Children read the token from the environment: it never appears on a command line.
  for (const char* env : {kTokenEnv, kShardTokenEnv}) {
    if (std::getenv(env) == nullptr) setenv(env, outer::NewCredential().c_str(), 1);
  }
  if (!options_.config_path.empty()) common_ = {"--config", options_.config_path};
  for (const auto& o : options_.overrides) common_.push_back(o);
  common_.push_back(absl::StrCat("--outer.islands=", options_.islands));
  return absl::OkStatus();
}

absl::Status LocalRun::StartCoordinator() {
  auto coord = std::make_unique<Child>();
  coord->name = "coordinator";
  coord->log.open(RunPath("coordinator.log"));
  std::vector<std::string> argv = {binary_, "coordinator", "--listen", "127.0.0.1:0", "--run-dir",
                                   RunPath("coordinator")};
  AddCoordinatorMonitoring(argv);
  argv.insert(argv.end(), common_.begin(), common_.end());
  ATL_RETURN_IF_ERROR(Spawn(*coord, argv));
  Child& c0 = *coord;
  children_.push_back(std::move(coord));
  while (address_.empty()) {
    bool open = Drain(c0, [&](const std::string& line) {
      OnLine(c0, line);
      const auto at = line.find("listening on ");
      if (at != std::string::npos) {
        address_ = line.substr(at + 13, line.find(' ', at + 13) - at - 13);
      }
    });
    if (!open && address_.empty()) {
      WaitAll(5);
      return absl::InternalError(absl::StrCat("the coordinator did not start (",
                                              Describe(c0.status), "); see ", options_.run_dir,
                                              "/coordinator.log"));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalRun::StartShard(int shard, const std::string& listen, bool resume) {
  auto child = std::make_unique<Child>();
  child->name = absl::StrCat("shard-", shard);
  child->log.open(RunPath(child->name + ".log"), std::ios::app);
  std::vector<std::string> argv = {binary_, "sync-server", "--shard",
                                   absl::StrCat(shard, "/", options_.shards), "--coordinator",
                                   address_, "--listen", listen,
                                   resume ? "--resume" : "--run-dir", RunPath(child->name)};
  argv.insert(argv.end(), common_.begin(), common_.end());
  ATL_RETURN_IF_ERROR(Spawn(*child, argv));
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

void LocalRun::AddCoordinatorMonitoring(std::vector<std::string>& argv) const {
  if (!options_.metrics_listen.empty()) argv.insert(argv.end(), {"--metrics-listen", options_.metrics_listen});
  if (!options_.http_listen.empty()) argv.insert(argv.end(), {"--http-listen", options_.http_listen});
  if (!options_.http_token_file.empty()) {
    argv.insert(argv.end(), {"--http-token-file", options_.http_token_file});
  }
}

absl::Status LocalRun::StartIsland(const std::string& name, double throttle) {
  auto island = std::make_unique<Child>();
  island->name = name;
  island->is_island = true;
  std::string base = name;
  const bool restart = LatestCheckpoint(RunPath(name)).ok();
  for (int k = 2; !restart && fs::exists(RunPath(base)); ++k) base = absl::StrCat(name, ".", k);
  const std::string dir = RunPath(base);
  island->log.open(RunPath(base + ".log"), std::ios::app);
  std::vector<std::string> a = {binary_, "island", "--coordinator", address_, "--name",
                                name,    "--run-dir", dir};
  if (restart) a.push_back("--resume");
  if (!options_.metrics_listen.empty()) {
    // island<i> on the coordinator's port + 1 + i; islands of other names after the M islands.
    int index = -1;
    if (!absl::StartsWith(name, "island") || !absl::SimpleAtoi(name.substr(6), &index) || index < 0) {
      index = options_.islands + other_islands_++;
    }
    ATL_ASSIGN_OR_RETURN(auto address, OffsetAddress(options_.metrics_listen, 1 + index));
    a.insert(a.end(), {"--metrics-listen", address});
  }
  if (throttle > 1) {
    a.push_back("--throttle");
    a.push_back(absl::StrCat(throttle));
  }
  if (options_.nproc > 1) {
    a.insert(a.end(), {"--nproc", absl::StrCat(options_.nproc), "--max-restarts",
                       absl::StrCat(options_.max_restarts)});
  }
  a.insert(a.end(), common_.begin(), common_.end());
  if (auto own = options_.island_overrides.find(name); own != options_.island_overrides.end()) {
    a.insert(a.end(), own->second.begin(), own->second.end());
  }
  ATL_RETURN_IF_ERROR(Spawn(*island, a));
  if (std::find(summary_.island_dirs.begin(), summary_.island_dirs.end(), dir) ==
      summary_.island_dirs.end()) {
    summary_.island_dirs.push_back(dir);
  }
  children_.push_back(std::move(island));
  return absl::OkStatus();
}

absl::Status LocalRun::RestartCoordinator() {
  std::fprintf(options_.out, "atoll local: restarting the coordinator with --resume\n");
  auto again = std::make_unique<Child>();
  again->name = "coordinator";
  again->log.open(RunPath("coordinator.log"), std::ios::app);
  std::vector<std::string> a = {binary_, "coordinator", "--listen", address_, "--resume",
                                RunPath("coordinator")};
  AddCoordinatorMonitoring(a);
  a.insert(a.end(), common_.begin(), common_.end());
  ATL_RETURN_IF_ERROR(Spawn(*again, a));
  children_.push_back(std::move(again));
  return absl::OkStatus();
}

absl::Status LocalRun::FireEvents() {
  for (size_t e = 0; e < options_.events.size(); ++e) {
    if (fired_[e] || committed_ < options_.events[e].round) continue;
    fired_[e] = true;
    ATL_RETURN_IF_ERROR(Fire(options_.events[e]));
  }
  return absl::OkStatus();
}

absl::Status LocalRun::Fire(const LocalEvent& ev) {
  const auto round = (unsigned long long)committed_;
  if (ev.kind == LocalEvent::kStop) {
    std::fprintf(options_.out, "atoll local: %.1fs: round %llu: SIGSTOP to %s for %.1f s\n",
                 now_s(), round, ev.island.c_str(), ev.seconds);
    chaos_target_->Signal(ev.island, SIGSTOP);
    paused_.emplace_back(ev.island, now_s() + ev.seconds);
    return absl::OkStatus();
  }
  if (ev.kind == LocalEvent::kJoin) {
    std::fprintf(options_.out, "atoll local: %.1fs: round %llu: starting %s\n", now_s(), round,
                 ev.island.c_str());
    return StartIsland(ev.island, 1.0);
  }
  Child* target = nullptr;
  for (auto& c : children_) {
    if (c->name == ev.island && !c->exited && !c->expected_end) target = c.get();
  }
  if (target == nullptr) {
    std::fprintf(options_.out, "atoll local: round %llu: %s is not running; nothing to stop\n",
                 round, ev.island.c_str());
    return absl::OkStatus();
  }
  const bool kill_it = ev.kind == LocalEvent::kKill;
  const char* sig = kill_it ? "SIGKILL" : "SIGTERM";
  if (ev.rank >= 0) {
    // One rank: the island's agent stops the others and restarts the island.
    auto it = target->rank_pids.find(ev.rank);
    if (it == target->rank_pids.end()) {
      std::fprintf(options_.out, "atoll local: round %llu: %s has no rank %d\n", round,
                   ev.island.c_str(), ev.rank);
      return absl::OkStatus();
    }
    std::fprintf(options_.out, "atoll local: %.1fs: round %llu: sending %s to rank %d of %s\n",
                 now_s(), round, sig, ev.rank, ev.island.c_str());
    recovering_.emplace_back(absl::StrCat(sig, " to ", ev.island, ".", ev.rank), now_s());
    kill(it->second, kill_it ? SIGKILL : SIGTERM);
    return absl::OkStatus();
  }
  std::fprintf(options_.out, "atoll local: %.1fs: round %llu: sending %s to %s\n", now_s(), round,
               sig, ev.island.c_str());
  recovering_.emplace_back(absl::StrCat(sig, " to ", ev.island), now_s());
  target->expected_end = true;
  kill(target->pid, kill_it ? SIGKILL : SIGTERM);
  if (target->is_island) return absl::OkStatus();
  waitpid(target->pid, &target->status, 0);
  target->exited = true;
  int shard = -1;
  if (absl::StartsWith(target->name, "shard-") &&
      absl::SimpleAtoi(target->name.substr(6), &shard)) {
    std::fprintf(options_.out, "atoll local: restarting %s with --resume\n", target->name.c_str());
    return StartShard(shard, target->address, /*resume=*/true);
  }
  return RestartCoordinator();
}

void LocalRun::OnLine(Child& c, const std::string& line) {
  c.log << line << "\n";
  c.log.flush();
  const bool prefixed = !line.empty() && line[0] == '[';
  std::fprintf(options_.out, "%s%s\n", prefixed ? "" : ("[" + c.name + "] ").c_str(), line.c_str());
  std::fflush(options_.out);
  if (const auto at = line.find("listening on "); !c.is_island && at != std::string::npos) {
    c.address = line.substr(at + 13, line.find(' ', at + 13) - at - 13);
  }
  // "atoll island: rank R of N started as pid P" (an island's agent)
  int r = 0, n = 0, pid = 0;
  if (c.is_island &&
      std::sscanf(line.c_str(), "atoll island: rank %d of %d started as pid %d", &r, &n, &pid) == 3) {
    c.rank_pids[r] = pid_t(pid);
  }
  if (chaos_ && c.is_island) chaos_->OnIslandLine(c.name, line);
  if (chaos_ && !c.is_island) chaos_->OnCoordinatorLine(line, now_s(), *chaos_target_);
  // "[fragment F ]round R committed (K/N): ..." (sync) or "version K applied ..." (async)
  uint64_t k = 0;
  std::string count;
  if (const auto at = line.find(" committed (");
      absl::StartsWith(line, "round ") || absl::StartsWith(line, "fragment ")) {
    if (at != std::string::npos) count = line.substr(at + 12, line.find('/', at) - at - 12);
  } else if (absl::StartsWith(line, "version ")) {
    count = line.substr(8, line.find(' ', 8) - 8);
  }
  if (!c.is_island && !count.empty() && absl::SimpleAtoi(count, &k)) {
    // Each shard of a sharded run counts its own rounds (a restarted process goes on counting).
    committed_by_[c.name] = std::max(committed_by_[c.name], k);
    committed_ = 0;
    for (const auto& [name, n] : committed_by_) committed_ += n;
    for (const auto& [what, when] : recovering_) {
      std::fprintf(options_.out, "atoll local: %.1fs: round %llu committed %.1f s after the %s\n",
                   now_s(), (unsigned long long)k, now_s() - when, what.c_str());
    }
    recovering_.clear();
  }
}

void LocalRun::Supervise() {
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children_) {
      if (c->out_fd >= 0) {
        fds.push_back({c->out_fd, POLLIN, 0});
        owners.push_back(c.get());
      }
    }
    // Every child ended: done, unless a failed island is still to come back.
    if (fds.empty() && !(chaos_ && chaos_->recovering())) return;
    poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        Child& c = *owners[i];
        Drain(c, [&](const std::string& line) { OnLine(c, line); });
      }
    }
    for (auto it = paused_.begin(); it != paused_.end();) {
      if (it->second > now_s()) {
        ++it;
        continue;
      }
      std::fprintf(options_.out, "atoll local: %.1fs: SIGCONT to %s\n", now_s(), it->first.c_str());
      chaos_target_->Signal(it->first, SIGCONT);
      it = paused_.erase(it);
    }
    if (!stopping_) {
      if (auto s = FireEvents(); !s.ok()) Stop(s);
      if (chaos_) {
        if (auto s = chaos_->Tick(now_s(), committed_, *chaos_target_); !s.ok()) Stop(s);
      }
    }
    Reap(children_);
    CheckChildren();
  }
}

bool LocalRun::Failed(Child& c) {
  if (!c.exited || c.expected_end || (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
    return false;
  }
  // A chaos victim that came back after the others ended the run finds no service: not a failure
  // of the run (the report counts only the islands that finished).
  if (chaos_ && chaos_->Casualty(c.name)) {
    c.expected_end = true;
    std::fprintf(options_.out, "atoll local: chaos: %s came back after the run had ended\n",
                 c.name.c_str());
    return false;
  }
  return true;
}

void LocalRun::CheckChildren() {
  for (auto& c : children_) {
    if (Failed(*c) && failure_.ok() && !stopping_) {
      Stop(absl::AbortedError(absl::StrCat(c->name, " ", Describe(c->status), "; see ",
                                           options_.run_dir, "/", c->name, ".log")));
      std::fprintf(options_.out, "atoll local: %s: stopping the others\n",
                   std::string(failure_.message()).c_str());
    }
  }
  // The coordinator ends by itself after the last round once every island has left; if it has
  // not within a grace period after the islands ended, it is told to.
  bool islands_exited = !(chaos_ && chaos_->recovering());
  for (auto& c : children_) islands_exited &= !c->is_island || c->exited;
  if (islands_exited && !stopping_) {
    if (islands_done_ == Clock::time_point{}) islands_done_ = Clock::now();
    if (Clock::now() - islands_done_ > std::chrono::seconds(10)) {
      stopping_ = true;
      StopAll(SIGTERM);
    }
  }
  if (!stopping_ && options_.stop != nullptr && options_.stop->load()) {
    std::fprintf(options_.out, "atoll local: stopping every process\n");
    Stop(absl::CancelledError("stopped by the user"));
  }
}

absl::Status LocalRun::ChaosReport() {
  ATL_ASSIGN_OR_RETURN(auto report,
                       chaos_->Report(RunPath("coordinator/rounds.jsonl"),
                                      uint64_t(options_.islands) * options_.tokens_per_island,
                                      options_.run_dir));
  std::fprintf(options_.out, "atoll local: chaos: %s\n", report.Text().c_str());
  std::ofstream(RunPath("chaos.json")) << report.Json() << "\n";
  summary_.goodput = report;
  return absl::OkStatus();
}

// The first failure is the run's; every process is asked to end.
void LocalRun::Stop(absl::Status why) {
  if (failure_.ok()) failure_ = std::move(why);
  stopping_ = true;
  StopAll(SIGTERM);
}

void LocalRun::StopAll(int sig) {
  for (auto& c : children_) {
    if (!c->exited && c->pid > 0) kill(c->pid, sig);
  }
}

void LocalRun::WaitAll(double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    Reap(children_);
    bool all = true;
    for (auto& c : children_) all &= c->exited;
    if (all) return;
    usleep(20000);
  }
  StopAll(SIGKILL);
  for (auto& c : children_) {
    if (!c->exited) waitpid(c->pid, &c->status, 0), c->exited = true;
  }
}

}  // namespace

absl::StatusOr<LocalSummary> RunLocal(const LocalOptions& options) {
  return LocalRun(options).Run();
}

}  // namespace atl
