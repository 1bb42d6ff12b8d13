#include "src/cli/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace atl {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int64_t StatusField(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::strtoll(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return -1;
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path)
    : log_path_(log_path) {
  std::vector<char*> args;  // built before fork: the child only calls async-signal-safe functions
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool ChildProcess::Alive() {
  if (reaped_ || pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return false;
  }
  return true;
}

std::string ChildProcess::WaitForOutput(const std::string& text, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string log;
  while (std::chrono::steady_clock::now() < until) {
    log = ReadAll(log_path_);
    if (log.find(text) != std::string::npos || !Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return log;
}

int ChildProcess::Wait(double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (Alive() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return reaped_ ? exit_code_ : -1;
}

int ChildProcess::Terminate(double timeout_s) {
  if (!Alive()) return exit_code_;
  kill(pid_, SIGTERM);
  return Wait(timeout_s);
}

int64_t ChildProcess::RssBytes() const { return StatusField(pid_, "VmRSS") * 1024; }
int64_t ChildProcess::PeakRssBytes() const { return StatusField(pid_, "VmHWM") * 1024; }
int ChildProcess::Threads() const { return int(StatusField(pid_, "Threads")); }

}  // namespace atl
