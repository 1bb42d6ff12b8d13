// The `atoll` binary's end-to-end tests: a run of it, and a directory with a tiny model's config
// and its text.
#ifndef ATOLL_TESTS_SRC_CLI_CLI_FIXTURE_H_
#define ATOLL_TESTS_SRC_CLI_CLI_FIXTURE_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/test_util.h"

namespace atl::testing {

inline CommandResult Atoll(const std::string& args) {
  return RunCommand(std::string(ATOLL_BIN) + " " + args);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_.Join("text.txt"), GeneratedText(30000, 5));
    WriteFile(dir_.Join("tiny.toml"),
              "[model]\nn_layer = 1\nd_model = 32\nn_head = 2\ncontext = 32\n"
              "[data]\npath = \"" + dir_.Join("text.txt") + "\"\nval_fraction = 0.1\n"
              "[train]\nsteps = 6\nbatch_size = 2\neval_every = 3\neval_batches = 1\n"
              "threads = 1\nlog_every = 2\n[optim]\nwarmup_steps = 2\n");
  }
  std::string Train(const std::string& extra) {
    return "train --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("run") + " " +
           extra;
  }
  bool RunDirExists() { return std::filesystem::exists(dir_.Join("run")); }
  TempDir dir_;
};

}  // namespace atl::testing

#endif  // ATOLL_TESTS_SRC_CLI_CLI_FIXTURE_H_
