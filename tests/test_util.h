// Shared helpers for the test suite: temporary directories, a small generated corpus, tiny configs.
#ifndef ATOLL_TESTS_TEST_UTIL_H_
#define ATOLL_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/files_util.h"
#include "tests/transport_util.h"
#include "src/cli/child_process.h"
#include "src/config/config.h"

namespace atl::testing {

using ::atl::ChildProcess;

// A config small enough for unit tests (2 layers, d_model 32, context 32) over `data_path`.
Config TinyConfig(const std::string& data_path);

}  // namespace atl::testing

#endif  // ATOLL_TESTS_TEST_UTIL_H_
