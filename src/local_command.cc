#include "src/local_command.h"

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

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "outer/credentials.h"
#include "src/checkpoint.h"
#include "src/rpc_security.h"

extern char** environ;

namespace atl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Child {
  std::string name;
  pid_t pid = -1;
  int out_fd = -1;     // read end of the child's stdout + stderr
  std::string partial;  // an unfinished line
  std::ofstream log;
  bool exited = false;
  int status = 0;
  bool is_island = false;
  bool expected_end = false;  // stopped by a scheduled event: its exit is not a failure
  std::map<int, pid_t> rank_pids;  // an island of several ranks: its agent's ranks
};

absl::Status Spawn(Child& child, const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&child.pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot start ", args[0], ": ", strerror(rc)));
  }
  child.out_fd = fds[0];
  return absl::OkStatus();
}

// Reads what is available; calls `line` for each complete line. False at end of stream.
template <typename F>
bool Drain(Child& c, F&& line) {
  char buf[4096];
  const ssize_t n = read(c.out_fd, buf, sizeof(buf));
  if (n <= 0) {
    if (!c.partial.empty()) line(c.partial);
    c.partial.clear();
    close(c.out_fd);
    c.out_fd = -1;
    return false;
  }
  c.partial.append(buf, size_t(n));
  size_t pos;
  while ((pos = c.partial.find('\n')) != std::string::npos) {
    line(c.partial.substr(0, pos));
    c.partial.erase(0, pos + 1);
  }
  return true;
}

void Reap(std::vector<std::unique_ptr<Child>>& children) {
  for (auto& c : children) {
    if (c->exited || c->pid <= 0) continue;
    int status;
    if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
      c->exited = true;
      c->status = status;
    }
  }
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "ended";
}

}  // namespace

absl::StatusOr<LocalEvent> ParseLocalEvent(LocalEvent::Kind kind, const std::string& text) {
  const char* flag = kind == LocalEvent::kKill ? "--kill" : kind == LocalEvent::kTerm ? "--term" : "--join";
  const std::vector<std::string> parts = absl::StrSplit(text, '@');
  uint64_t round = 0;
  if (parts.size() != 2 || parts[0].empty() || !absl::StartsWith(parts[1], "round") ||
      !absl::SimpleAtoi(parts[1].substr(5), &round)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", text,
                                                   "': expected ISLAND@roundN, e.g. island1@round3"));
  }
  LocalEvent e;
  e.kind = kind;
  e.round = round;
  std::string who = parts[0];
  if (const auto dot = who.rfind('.'); dot != std::string::npos) {
    if (!absl::SimpleAtoi(who.substr(dot + 1), &e.rank) || e.rank < 0 || kind == LocalEvent::kJoin) {
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

absl::StatusOr<LocalSummary> RunLocal(const LocalOptions& options) {
  if (options.islands < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--islands must be >= 1, got ", options.islands));
  }
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  if (fs::exists(fs::path(options.run_dir) / "coordinator")) {
    return absl::AlreadyExistsError(
        absl::StrCat("run directory ", options.run_dir, " already holds a run"));
  }
  std::string binary = options.atoll_binary;
  if (binary.empty()) binary = fs::read_symlink("/proc/self/exe").string();
  std::error_code ec;
  fs::create_directories(options.run_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", options.run_dir));
  // Children read the token from the environment: it never appears on a command line.
  if (std::getenv(kTokenEnv) == nullptr) setenv(kTokenEnv, outer::NewCredential().c_str(), 1);

  std::vector<std::string> common;
  if (!options.config_path.empty()) common = {"--config", options.config_path};
  for (const auto& o : options.overrides) common.push_back(o);
  common.push_back(absl::StrCat("--outer.islands=", options.islands));

  const auto start = Clock::now();
  std::vector<std::unique_ptr<Child>> children;
  auto emit = [&](Child& c, const std::string& line) {
    c.log << line << "\n";
    c.log.flush();
    const bool prefixed = !line.empty() && line[0] == '[';
    std::fprintf(options.out, "%s%s\n", prefixed ? "" : ("[" + c.name + "] ").c_str(), line.c_str());
    std::fflush(options.out);
  };
  auto stop_all = [&](int sig) {
    for (auto& c : children) {
      if (!c->exited && c->pid > 0) kill(c->pid, sig);
    }
  };
  auto wait_all = [&](double seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      Reap(children);
      bool all = true;
      for (auto& c : children) all &= c->exited;
      if (all) return;
      usleep(20000);
    }
    stop_all(SIGKILL);
    for (auto& c : children) {
      if (!c->exited) waitpid(c->pid, &c->status, 0), c->exited = true;
    }
  };

  // Coordinator first; its first line names the address it bound.
  auto coord = std::make_unique<Child>();
  coord->name = "coordinator";
  coord->log.open(fs::path(options.run_dir) / "coordinator.log");
  std::vector<std::string> argv = {binary, "coordinator", "--listen", "127.0.0.1:0", "--run-dir",
                                   (fs::path(options.run_dir) / "coordinator").string()};
  argv.insert(argv.end(), common.begin(), common.end());
  if (auto s = Spawn(*coord, argv); !s.ok()) return s;
  Child& c0 = *coord;
  children.push_back(std::move(coord));
  std::string address;
  while (address.empty()) {
    bool open = Drain(c0, [&](const std::string& line) {
      emit(c0, line);
      const auto at = line.find("listening on ");
      if (at != std::string::npos) {
        address = line.substr(at + 13, line.find(' ', at + 13) - at - 13);
      }
    });
    if (!open && address.empty()) {
      wait_all(5);
      return absl::InternalError(absl::StrCat("the coordinator did not start (",
                                              Describe(c0.status), "); see ", options.run_dir,
                                              "/coordinator.log"));
    }
  }

  LocalSummary summary;
  // An island process. A name started before is restarted from its newest checkpoint (--resume);
  // without one it starts afresh in a directory of its own.
  auto start_island = [&](const std::string& name, double throttle) -> absl::Status {
    auto island = std::make_unique<Child>();
    island->name = name;
    island->is_island = true;
    std::string base = name;
    const bool restart = LatestCheckpoint((fs::path(options.run_dir) / name).string()).ok();
    for (int k = 2; !restart && fs::exists(fs::path(options.run_dir) / base); ++k) {
      base = absl::StrCat(name, ".", k);
    }
    const std::string dir = (fs::path(options.run_dir) / base).string();
    island->log.open(fs::path(options.run_dir) / (base + ".log"), std::ios::app);
    std::vector<std::string> a = {binary, "island", "--coordinator", address, "--name",
                                  name, "--run-dir", dir};
    if (restart) a.push_back("--resume");
    if (throttle > 1) {
      a.push_back("--throttle");
      a.push_back(absl::StrCat(throttle));
    }
    if (options.nproc > 1) {
      a.insert(a.end(), {"--nproc", absl::StrCat(options.nproc), "--max-restarts",
                         absl::StrCat(options.max_restarts)});
    }
    a.insert(a.end(), common.begin(), common.end());
    if (auto s = Spawn(*island, a); !s.ok()) return s;
    if (std::find(summary.island_dirs.begin(), summary.island_dirs.end(), dir) ==
        summary.island_dirs.end()) {
      summary.island_dirs.push_back(dir);
    }
    children.push_back(std::move(island));
    return absl::OkStatus();
  };
  for (int i = 0; i < options.islands; ++i) {
    const double throttle = size_t(i) < options.throttle.size() ? options.throttle[size_t(i)] : 1.0;
    if (auto s = start_island(absl::StrCat("island", i), throttle); !s.ok()) {
      stop_all(SIGTERM);
      wait_all(10);
      return s;
    }
  }
  // Scheduled events fire when the coordinator reports the round they wait for.
  std::vector<bool> fired(options.events.size(), false);
  uint64_t committed = 0;
  auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  // Events waiting for the next commit, which shows the run has recovered from them.
  std::vector<std::pair<std::string, double>> recovering;
  auto fire_events = [&]() -> absl::Status {
    for (size_t e = 0; e < options.events.size(); ++e) {
      const LocalEvent& ev = options.events[e];
      if (fired[e] || committed < ev.round) continue;
      fired[e] = true;
      if (ev.kind == LocalEvent::kJoin) {
        std::fprintf(options.out, "atoll local: %.1fs: round %llu: starting %s\n", now_s(),
                     (unsigned long long)committed, ev.island.c_str());
        if (auto s = start_island(ev.island, 1.0); !s.ok()) return s;
        continue;
      }
      Child* target = nullptr;
      for (auto& c : children) {
        if (c->name == ev.island && !c->exited && !c->expected_end) target = c.get();
      }
      if (target == nullptr) {
        std::fprintf(options.out, "atoll local: round %llu: %s is not running; nothing to stop\n",
                     (unsigned long long)committed, ev.island.c_str());
        continue;
      }
      const bool kill_it = ev.kind == LocalEvent::kKill;
      if (ev.rank >= 0) {
        // One rank: the island's agent stops the others and restarts the island.
        auto it = target->rank_pids.find(ev.rank);
        if (it == target->rank_pids.end()) {
          std::fprintf(options.out, "atoll local: round %llu: %s has no rank %d\n",
                       (unsigned long long)committed, ev.island.c_str(), ev.rank);
          continue;
        }
        std::fprintf(options.out, "atoll local: %.1fs: round %llu: sending %s to rank %d of %s\n",
                     now_s(), (unsigned long long)committed, kill_it ? "SIGKILL" : "SIGTERM",
                     ev.rank, ev.island.c_str());
        recovering.emplace_back(absl::StrCat(kill_it ? "SIGKILL" : "SIGTERM", " to ", ev.island,
                                             ".", ev.rank),
                                now_s());
        kill(it->second, kill_it ? SIGKILL : SIGTERM);
        continue;
      }
      std::fprintf(options.out, "atoll local: %.1fs: round %llu: sending %s to %s\n", now_s(),
                   (unsigned long long)committed, kill_it ? "SIGKILL" : "SIGTERM",
                   ev.island.c_str());
      recovering.emplace_back(absl::StrCat(kill_it ? "SIGKILL" : "SIGTERM", " to ", ev.island),
                              now_s());
      target->expected_end = true;
      kill(target->pid, kill_it ? SIGKILL : SIGTERM);
      if (!target->is_island) {
        // The coordinator comes back at once on the same address, from its durable state.
        waitpid(target->pid, &target->status, 0);
        target->exited = true;
        std::fprintf(options.out, "atoll local: restarting the coordinator with --resume\n");
        auto again = std::make_unique<Child>();
        again->name = "coordinator";
        again->log.open(fs::path(options.run_dir) / "coordinator.log", std::ios::app);
        std::vector<std::string> a = {binary, "coordinator", "--listen", address, "--resume",
                                      (fs::path(options.run_dir) / "coordinator").string()};
        a.insert(a.end(), common.begin(), common.end());
        if (auto s = Spawn(*again, a); !s.ok()) return s;
        children.push_back(std::move(again));
      }
    }
    return absl::OkStatus();
  };

  absl::Status failure;
  bool stopping = false;
  Clock::time_point islands_done{};
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children) {
      if (c->out_fd >= 0) {
        fds.push_back({c->out_fd, POLLIN, 0});
        owners.push_back(c.get());
      }
    }
    if (fds.empty()) break;
    poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        Child& c = *owners[i];
        Drain(c, [&](const std::string& line) {
          emit(c, line);
          // "atoll island: rank R of N started as pid P" (an island's agent)
          int r = 0, n = 0, pid = 0;
          if (c.is_island &&
              std::sscanf(line.c_str(), "atoll island: rank %d of %d started as pid %d", &r, &n,
                          &pid) == 3) {
            c.rank_pids[r] = pid_t(pid);
          }
          // "round K/N committed ..." (sync) or "version K applied ..." (async)
          uint64_t k = 0;
          const auto space = line.find_first_of(" /", line.find(' ') + 1);
          if (!c.is_island && (absl::StartsWith(line, "round ") || absl::StartsWith(line, "version ")) &&
              absl::SimpleAtoi(line.substr(line.find(' ') + 1, space - line.find(' ') - 1), &k)) {
            committed = std::max(committed, k);
            for (const auto& [what, when] : recovering) {
              std::fprintf(options.out, "atoll local: %.1fs: round %llu committed %.1f s after the %s\n",
                           now_s(), (unsigned long long)k, now_s() - when, what.c_str());
            }
            recovering.clear();
          }
        });
      }
    }
    if (!stopping) {
      if (auto s = fire_events(); !s.ok() && failure.ok()) {
        failure = s;
        stopping = true;
        stop_all(SIGTERM);
      }
    }
    Reap(children);
    for (auto& c : children) {
      const bool failed = c->exited && !c->expected_end &&
                          !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
      if (failed && failure.ok() && !stopping) {
        failure = absl::AbortedError(absl::StrCat(c->name, " ", Describe(c->status), "; see ",
                                                  options.run_dir, "/", c->name, ".log"));
        std::fprintf(options.out, "atoll local: %s: stopping the others\n",
                     std::string(failure.message()).c_str());
        stopping = true;
        stop_all(SIGTERM);
      }
    }
    // The coordinator ends by itself after the last round once every island has left; if it has
    // not within a grace period after the islands ended, it is told to.
    bool islands_exited = true;
    for (auto& c : children) islands_exited &= !c->is_island || c->exited;
    if (islands_exited && !stopping) {
      if (islands_done == Clock::time_point{}) islands_done = Clock::now();
      if (Clock::now() - islands_done > std::chrono::seconds(10)) {
        stopping = true;
        stop_all(SIGTERM);
      }
    }
    if (!stopping && options.stop != nullptr && options.stop->load()) {
      std::fprintf(options.out, "atoll local: stopping every process\n");
      failure = absl::CancelledError("stopped by the user");
      stopping = true;
      stop_all(SIGTERM);
    }
  }
  // Pipes closed: every child has ended or is about to.
  wait_all(stopping ? 10 : 30);
  for (auto& c : children) {
    const bool failed = !c->expected_end && !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
    if (failed && failure.ok() && c->is_island) {
      failure = absl::AbortedError(absl::StrCat(c->name, " ", Describe(c->status), "; see ",
                                                options.run_dir, "/", c->name, ".log"));
    }
  }
  summary.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (!failure.ok()) return failure;
  return summary;
}

}  // namespace atl
