#include "tests/fuzz/fuzz_input.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace atl::fuzz {

std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/atoll-fuzz-" +
                           std::to_string(getpid()) + "-" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // the harness cannot run: not a finding
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace atl::fuzz
