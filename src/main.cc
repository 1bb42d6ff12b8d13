// atoll: train one language model across islands joined by slow links.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "src/config.h"
#include "src/train_command.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  if (g_stop.exchange(true)) std::_Exit(130);  // second Ctrl-C: leave now
}

std::string KeysHelp() {
  std::string out = "Config keys (set in the TOML file or as --key=value):\n";
  for (const auto& [key, doc] : atl::DescribeKeys()) {
    out += absl::StrFormat("  %-24s %s\n", key, doc);
  }
  return out;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "atoll: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"atoll: DiLoCo and Streaming DiLoCo training across islands"};
  app.require_subcommand(1);

  std::string config_path, run_dir;
  bool resume = false;
  auto* train = app.add_subcommand("train", "train one island alone (the centralized baseline)");
  train->add_option("--config", config_path, "TOML config (presets in deploy/configs/)");
  train->add_option("--run-dir", run_dir, "directory for config.toml, metrics.jsonl, checkpoints")
      ->required();
  train->add_flag("--resume", resume, "continue from the newest checkpoint in --run-dir");
  train->allow_extras();
  train->footer(KeysHelp());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (train->parsed()) {
    auto overrides = atl::ParseOverrides(train->remaining());
    if (!overrides.ok()) return Fail(overrides.status());
    auto config = atl::LoadConfig(config_path, *overrides);
    if (!config.ok()) return Fail(config.status());
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    atl::TrainOptions options;
    options.run_dir = run_dir;
    options.resume = resume;
    options.tty = isatty(fileno(stderr));
    options.stop = &g_stop;
    auto summary = atl::Train(*config, options);
    if (!summary.ok()) return Fail(summary.status());
    std::string val = "no evaluation";
    if (summary->last_eval) {
      val = absl::StrFormat("val_loss %.4f (%.3f %s)", summary->last_eval->loss,
                            summary->last_eval->bits,
                            summary->last_eval->per_byte ? "bits/byte" : "bits/token");
    }
    std::printf("%s at step %lld: %s, %lld tokens, %.0f tokens/s, wall %.1fs; checkpoint in %s\n",
                summary->stopped ? "stopped" : "done", (long long)summary->step, val.c_str(),
                (long long)summary->tokens, summary->tokens_per_s, summary->wall_s,
                run_dir.c_str());
    return summary->stopped ? 130 : 0;
  }
  return 0;
}
