#include "tests/files_util.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
  if (std::getenv("ATOLL_KEEP_TEST_DIRS") != nullptr) return;  // for a failure's post-mortem
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

}  // namespace atl::testing
