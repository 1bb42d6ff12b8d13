// Test helpers that need nothing of atoll (the torch-free tests use them too): a temporary
// directory, files, shell commands, deterministic text.
#ifndef ATOLL_TESTS_FILES_UTIL_H_
#define ATOLL_TESTS_FILES_UTIL_H_

#include <cstdint>
#include <string>

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

}  // namespace atl::testing

#endif  // ATOLL_TESTS_FILES_UTIL_H_
