// A program started in the background with its output in a file, and what /proc says of it: used
// by `atoll loadtest` (a real coordinator process, its peak memory) and by the tests.
#ifndef ATOLL_SRC_CLI_CHILD_PROCESS_H_
#define ATOLL_SRC_CLI_CHILD_PROCESS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace atl {

// argv[0] is the program; its stdout and stderr go to `log_path`. SIGKILLed when the object dies
// if it is still running.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int pid() const { return pid_; }
  bool Alive();
  // Waits up to `timeout_s` for `text` to appear in the log (or the process to end); returns the log.
  std::string WaitForOutput(const std::string& text, double timeout_s);
  // Waits up to `timeout_s` for the process to end; its exit code (-1: killed by a signal or still
  // running).
  int Wait(double timeout_s);
  // SIGTERM, then waits; returns the exit code as Wait does.
  int Terminate(double timeout_s = 10);
  // From /proc/PID/status: resident memory and its peak (bytes), and the thread count; -1 once the
  // process has ended.
  int64_t RssBytes() const;
  int64_t PeakRssBytes() const;
  int Threads() const;

 private:
  int pid_ = -1;
  std::string log_path_;
  bool reaped_ = false;
  int exit_code_ = -1;
};

}  // namespace atl

#endif  // ATOLL_SRC_CLI_CHILD_PROCESS_H_
