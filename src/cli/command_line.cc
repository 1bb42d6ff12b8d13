#include "src/cli/command_line.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace atl::cli {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  if (g_stop.exchange(true)) std::_Exit(130);  // second Ctrl-C: leave now
}

std::string KeysHelp() {
  std::string out = "Config keys (set in the TOML file or as --key=value):\n";
  for (const auto& [key, doc] : DescribeKeys()) {
    out += absl::StrFormat("  %-24s %s\n", key, doc);
  }
  return out;
}

bool ParseCount(const std::string& text, int64_t* out) {
  double scale = 1;
  std::string number = text;
  if (!number.empty()) {
    switch (number.back()) {
      case 'K': case 'k': scale = 1e3; break;
      case 'M': case 'm': scale = 1e6; break;
      case 'B': case 'b': case 'G': case 'g': scale = 1e9; break;
      default: break;
    }
    if (scale != 1) number.pop_back();
  }
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(v * scale >= 1) ||
      v * scale > 1e15) {
    return false;
  }
  *out = int64_t(v * scale);
  return true;
}

std::string SelfPath() {
  char self[4096];
  if (const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1); n > 0) {
    return std::string(self, size_t(n));
  }
  return "/proc/self/exe";
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "atoll: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

// The run's config: --config and the --key=value overrides.
absl::StatusOr<Config> RunConfig(const CommandLine& cl, const std::vector<Override>& overrides) {
  return atl::LoadConfig(cl.config_path, overrides);
}

}  // namespace atl::cli
