#include "outer/base/moment_values.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace atl::outer {

std::string MomentValuesProblem(const float* values, uint64_t begin, uint64_t count,
                                uint64_t n) {
  for (uint64_t i = 0; i < count; ++i) {
    const float v = values[i];
    const uint64_t at = begin + i;
    const uint32_t channel = n > 0 && at >= n ? 1 : 0;
    if (std::isfinite(v) && std::fabs(v) <= kMomentMaxAbs[channel] && !(channel == 1 && v < 0)) {
      continue;
    }
    return absl::StrCat("element ", at, " (channel ", channel, ", parameter ",
                        n > 0 ? at % n : at, ") is ", v,
                        !std::isfinite(v)              ? ""
                        : channel == 1 && v < 0        ? " (a second moment is never negative)"
                                                       : absl::StrCat(" (at most ", kMomentMaxAbs[channel],
                                                                      " in magnitude)"));
  }
  return "";
}

}  // namespace atl::outer
