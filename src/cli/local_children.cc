#include "src/cli/local_children.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace atl::local {

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

}  // namespace atl::local
