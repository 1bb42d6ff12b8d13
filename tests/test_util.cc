#include "tests/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace atl::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/atoll-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  path_ = mkdtemp(buf.data());
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string GeneratedText(size_t bytes, uint64_t seed) {
  static const char* kSubjects[] = {"the cat", "a dog", "the old man", "my sister", "the bird",
                                    "our teacher", "a child", "the farmer"};
  static const char* kVerbs[] = {"sees", "likes", "finds", "carries", "paints", "follows"};
  static const char* kObjects[] = {"the red ball", "a small house", "the river", "an apple",
                                   "the green hill", "a long letter", "the moon"};
  static const char* kEnds[] = {".", " today.", " again.", " slowly.", "!"};
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  auto pick = [&s](size_t n) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return size_t((s >> 33) % n);
  };
  std::string out;
  while (out.size() < bytes) {
    std::string sentence = std::string(kSubjects[pick(8)]) + " " + kVerbs[pick(6)] + " " +
                           kObjects[pick(7)] + kEnds[pick(5)];
    sentence[0] = char(sentence[0] - 'a' + 'A');
    out += sentence;
    out += pick(4) == 0 ? "\n" : " ";
  }
  out.resize(bytes);
  return out;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CommandResult RunCommand(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CommandResult r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
  const int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path)
    : log_path_(log_path) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
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
  if (reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    return false;
  }
  return true;
}

std::string ChildProcess::WaitForOutput(const std::string& text, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string log;
  while (std::chrono::steady_clock::now() < until) {
    log = ReadFile(log_path_);
    if (log.find(text) != std::string::npos || !Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return log;
}

int ChildProcess::Terminate(double timeout_s) {
  if (reaped_) return -1;
  kill(pid_, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

namespace {

int64_t StatusField(int pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::strtoll(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return -1;
}

}  // namespace

int64_t ChildProcess::RssBytes() const { return StatusField(pid_, "VmRSS") * 1024; }
int64_t ChildProcess::PeakRssBytes() const { return StatusField(pid_, "VmHWM") * 1024; }
int ChildProcess::Threads() const { return int(StatusField(pid_, "Threads")); }

Config TinyConfig(const std::string& data_path) {
  Config c;
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 2;
  c.model.context = 32;
  c.data.path = data_path;
  c.data.val_fraction = 0.1;
  c.train.steps = 40;
  c.train.batch_size = 4;
  c.train.eval_every = 10;
  c.train.eval_batches = 2;
  c.train.threads = 1;
  c.optim.lr = 3e-3;
  c.optim.warmup_steps = 5;
  c.run.log_every = 10;
  return c;
}

}  // namespace atl::testing
