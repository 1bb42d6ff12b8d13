// Internal to the `atoll` binary: what its subcommands (main.cc, main_tools.cc) share.
#ifndef ATOLL_SRC_CLI_COMMAND_LINE_H_
#define ATOLL_SRC_CLI_COMMAND_LINE_H_

#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/config/config.h"
#include "src/net/rpc_security.h"

namespace atl::cli {

// Set by SIGINT / SIGTERM (a second one leaves at once).
extern std::atomic<bool> g_stop;
void OnSignal(int);

// Every config key with its documentation (each subcommand's help footer).
std::string KeysHelp();
// "500M", "1.5B", "2e9", "20000000": a parameter count.
bool ParseCount(const std::string& text, int64_t* out);
// This program, to start it again (an island's ranks, the load test's coordinator).
std::string SelfPath();
// Prints "atoll: error: ..." and returns the exit code 2.
int Fail(const absl::Status& status);

// The options every command may share, filled by CLI11.
struct CommandLine {
  std::string config_path, run_dir, token_file;
  std::string metrics_listen, http_listen;  // off when empty
  std::string http_token_file;              // the status page's token (off when empty)
  TlsFiles tls;
  int argc = 0;
  char** argv = nullptr;
};

// A subcommand and what runs it once parsed; `overrides` are its --key=value arguments.
struct Command {
  CLI::App* app = nullptr;
  std::function<int(const std::vector<Override>& overrides)> run;
};

// The run's config: --config and the --key=value overrides.
absl::StatusOr<Config> RunConfig(const CommandLine& cl, const std::vector<Override>& overrides);

// The tools (main_tools.cc): the load test, the planner, export, import, generate, tokenizers.
Command AddLoadtest(CLI::App& app, CommandLine& cl);
Command AddPlan(CLI::App& app, CommandLine& cl);
Command AddExport(CLI::App& app, CommandLine& cl);
Command AddImport(CLI::App& app, CommandLine& cl);
Command AddGenerate(CLI::App& app, CommandLine& cl);
Command AddTokenizer(CLI::App& app, CommandLine& cl);
Command AddTokenize(CLI::App& app, CommandLine& cl);
Command AddReport(CLI::App& app, CommandLine& cl);

}  // namespace atl::cli

#endif  // ATOLL_SRC_CLI_COMMAND_LINE_H_
