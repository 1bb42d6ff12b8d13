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

absl::StatusOr<::atollpb::v1::PushResponse> PushAll(
    outer::Transport& transport, const std::vector<::atollpb::v1::PushRequest>& requests) {
  size_t next = 0;
  return transport.Push(
      [&](::atollpb::v1::PushRequest* m) -> absl::StatusOr<bool> {
        if (next == requests.size()) return false;
        *m = requests[next++];
        return true;
      },
      0);
}

absl::StatusOr<std::vector<::atollpb::v1::StateChunk>> FetchAll(
    outer::Transport& transport, const ::atollpb::v1::FetchStateRequest& request) {
  std::vector<::atollpb::v1::StateChunk> out;
  auto s = transport.FetchState(
      request,
      [&](::atollpb::v1::StateChunk&& c) {
        out.push_back(std::move(c));
        return absl::OkStatus();
      },
      0);
  if (!s.ok()) return s;
  return out;
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
  c.train.log_every = 10;
  return c;
}

}  // namespace atl::testing
