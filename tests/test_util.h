// Shared helpers for the test suite: temporary directories, a small generated corpus, tiny configs.
#ifndef ATOLL_TESTS_TEST_UTIL_H_
#define ATOLL_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "src/config.h"

namespace atl::testing {

// A fresh directory under the test's TMPDIR, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic English-like text from a small grammar: learnable structure, no network needed.
std::string GeneratedText(size_t bytes, uint64_t seed);

void WriteFile(const std::string& path, const std::string& contents);
std::string ReadFile(const std::string& path);

struct CommandResult {
  int exit_code = -1;  // -1 when the command did not exit normally
  std::string output;  // stdout and stderr together
};
// Runs a shell command to completion.
CommandResult RunCommand(const std::string& command);

// A process started in the background (argv[0] is the program), its output in `log_path`;
// SIGKILLed when the object dies if it is still running.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~ChildProcess();
  int pid() const { return pid_; }
  bool Alive();
  // Waits up to `timeout_s` for `text` to appear in the log; returns the log.
  std::string WaitForOutput(const std::string& text, double timeout_s);
  // SIGTERM, then waits; returns the exit code (-1: killed by a signal or still running).
  int Terminate(double timeout_s = 10);
  // From /proc/PID/status: resident memory and its peak (bytes), and the thread count.
  int64_t RssBytes() const;
  int64_t PeakRssBytes() const;
  int Threads() const;

 private:
  int pid_ = -1;
  std::string log_path_;
  bool reaped_ = false;
};

// A config small enough for unit tests (2 layers, d_model 32, context 32) over `data_path`.
Config TinyConfig(const std::string& data_path);

}  // namespace atl::testing

#endif  // ATOLL_TESTS_TEST_UTIL_H_
