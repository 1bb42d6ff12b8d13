// Internal to src/cli: the children of `atoll local` (its coordinator, shard servers and islands)
// as processes whose stdout and stderr come back through a pipe, line by line.
#ifndef ATOLL_SRC_CLI_LOCAL_CHILDREN_H_
#define ATOLL_SRC_CLI_LOCAL_CHILDREN_H_

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace atl::local {

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
  std::string address;             // the coordinator or a shard: where it listens
};

// Starts argv[0] with argv, its stdout and stderr into child.out_fd.
absl::Status Spawn(Child& child, const std::vector<std::string>& argv);

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

// Notes the children that have exited (without waiting).
void Reap(std::vector<std::unique_ptr<Child>>& children);
// "exited with status N", "was killed by signal N".
std::string Describe(int status);

}  // namespace atl::local

#endif  // ATOLL_SRC_CLI_LOCAL_CHILDREN_H_
