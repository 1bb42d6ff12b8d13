// The config parser on arbitrary TOML and command-line overrides; an accepted config must survive
// its own round trip through ToToml (what run directories and checkpoints store).
#include <cstdlib>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "tests/fuzz/fuzz_input.h"

using namespace atl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::string toml = in.Record();
  std::vector<std::string> args;
  while (!in.empty()) args.push_back(in.Record());
  const std::string path =
      fuzz::WriteScratch("config.toml", reinterpret_cast<const uint8_t*>(toml.data()), toml.size());
  auto overrides = ParseOverrides(args);
  auto config = LoadConfig(path, overrides.ok() ? *overrides : std::vector<Override>{});
  if (config.ok()) {
    const std::string text = ToToml(*config);
    const std::string again_path = fuzz::WriteScratch(
        "config-again.toml", reinterpret_cast<const uint8_t*>(text.data()), text.size());
    auto again = LoadConfig(again_path, {});
    if (!again.ok() || ToToml(*again) != text) std::abort();  // the round trip lost something
  }
  return 0;
}
