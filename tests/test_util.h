// Shared helpers for the test suite: temporary directories, a small generated corpus, tiny configs.
#ifndef ATOLL_TESTS_TEST_UTIL_H_
#define ATOLL_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/transport.h"
#include "src/cli/child_process.h"
#include "src/config/config.h"

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

// Calls on a transport with whole payloads, for tests: a push of these messages; the chunks of a
// state transfer or an update, collected.
absl::StatusOr<::atollpb::v1::PushResponse> PushAll(
    outer::Transport& transport, const std::vector<::atollpb::v1::PushRequest>& requests);
absl::StatusOr<std::vector<::atollpb::v1::StateChunk>> FetchAll(
    outer::Transport& transport, const ::atollpb::v1::FetchStateRequest& request);

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

using ::atl::ChildProcess;

// A config small enough for unit tests (2 layers, d_model 32, context 32) over `data_path`.
Config TinyConfig(const std::string& data_path);

}  // namespace atl::testing

#endif  // ATOLL_TESTS_TEST_UTIL_H_
