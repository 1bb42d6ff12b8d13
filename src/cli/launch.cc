#include "src/cli/launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"

extern char** environ;

namespace atl {
namespace {

using Clock = std::chrono::steady_clock;

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Rank {
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
};

// The environment of rank `r`: ours, with the torchrun variables replaced.
std::vector<std::string> RankEnvironment(int r, int n, int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    bool ours = false;
    for (const char* k : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                          "MASTER_ADDR=", "MASTER_PORT="}) {
      ours |= v.rfind(k, 0) == 0;
    }
    if (!ours) env.push_back(v);
  }
  env.push_back(absl::StrCat("RANK=", r));
  env.push_back(absl::StrCat("LOCAL_RANK=", r));
  env.push_back(absl::StrCat("WORLD_SIZE=", n));
  env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", n));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(absl::StrCat("MASTER_PORT=", port));
  return env;
}

absl::Status Start(const LaunchOptions& o, bool resume, std::vector<Rank>& ranks) {
  const int port = FreeLoopbackPort();
  std::vector<std::string> args = {o.binary, "island"};
  args.insert(args.end(), o.args.begin(), o.args.end());
  if (resume) args.push_back("--resume");
  ranks.assign(size_t(o.nproc), Rank());
  for (int r = 0; r < o.nproc; ++r) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    auto env = RankEnvironment(r, o.nproc, port);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int rc = posix_spawn(&ranks[size_t(r)].pid, argv[0], nullptr, nullptr, argv.data(),
                               envp.data());
    if (rc != 0) return absl::InternalError(absl::StrCat("cannot start rank ", r, ": ", strerror(rc)));
    std::fprintf(stderr, "atoll island: rank %d of %d started as pid %d\n", r, o.nproc,
                 int(ranks[size_t(r)].pid));
  }
  return absl::OkStatus();
}

// Reaps what has exited; true when every rank has.
bool Reap(std::vector<Rank>& ranks) {
  bool all = true;
  for (auto& r : ranks) {
    if (!r.exited && waitpid(r.pid, &r.status, WNOHANG) == r.pid) r.exited = true;
    all &= r.exited;
  }
  return all;
}

bool Failed(const Rank& r) {
  return r.exited && !(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
}

std::string Describe(const Rank& r) {
  if (WIFSIGNALED(r.status)) return absl::StrCat("killed by signal ", WTERMSIG(r.status));
  return absl::StrCat("exit code ", WEXITSTATUS(r.status));
}

// SIGTERM to the ranks still running, SIGKILL to those still running after the grace period.
void StopAll(std::vector<Rank>& ranks, double grace_s) {
  for (auto& r : ranks) {
    if (!r.exited) kill(r.pid, SIGTERM);
  }
  const auto until = Clock::now() + std::chrono::duration<double>(grace_s);
  while (!Reap(ranks) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (auto& r : ranks) {
    if (!r.exited) {
      kill(r.pid, SIGKILL);
      waitpid(r.pid, &r.status, 0);
      r.exited = true;
    }
  }
}

}  // namespace

absl::Status LaunchIsland(const LaunchOptions& o) {
  if (o.nproc < 1) return absl::InvalidArgumentError("--nproc must be at least 1");
  if (o.max_restarts < 0) return absl::InvalidArgumentError("--max-restarts must be >= 0");
  std::vector<Rank> ranks;
  for (int attempt = 0; attempt <= o.max_restarts; ++attempt) {
    ATL_RETURN_IF_ERROR(Start(o, attempt > 0, ranks));
    bool forwarded = false;
    int failed = -1;
    while (!Reap(ranks)) {
      if (o.stop != nullptr && o.stop->load() && !forwarded) {
        for (auto& r : ranks) {
          if (!r.exited) kill(r.pid, SIGTERM);  // every rank leaves at the same step
        }
        forwarded = true;
      }
      for (size_t i = 0; i < ranks.size() && failed < 0; ++i) {
        if (Failed(ranks[i])) failed = int(i);
      }
      if (failed >= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (failed < 0) {
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (Failed(ranks[i])) failed = int(i);
      }
    }
    if (failed < 0) return absl::OkStatus();
    // A rank failed: the others cannot go on without it (their next collective fails within its
    // timeout); stop them all and start the island again from its checkpoint.
    std::fprintf(stderr, "atoll island: rank %d failed (%s); stopping the island's other ranks\n",
                 failed, Describe(ranks[size_t(failed)]).c_str());
    StopAll(ranks, o.grace_s);
    if (forwarded || (o.stop != nullptr && o.stop->load())) {
      return absl::AbortedError("the island was stopped");
    }
    if (attempt < o.max_restarts) {
      std::fprintf(stderr, "atoll island: restarting the island from its newest checkpoint "
                           "(restart %d of %d)\n",
                   attempt + 1, o.max_restarts);
    }
  }
  return absl::AbortedError(absl::StrCat("a rank of the island failed and no restart is left (",
                                         o.max_restarts, " allowed)"));
}

}  // namespace atl
