// The bounds every optimizer moment that crosses the wire meets (outer.moment_sync_every): the
// service refuses a push past them, and an island, live or joining, loads no average past them.
#ifndef ATOLL_OUTER_BASE_MOMENT_VALUES_H_
#define ATOLL_OUTER_BASE_MOMENT_VALUES_H_

#include <cstdint>
#include <string>

#include "outer/base/payload.h"

namespace atl::outer {

// The largest magnitude a moment may have, per channel: a first moment (a mean of gradients,
// AdamW's or Muon's momentum) of 1e6, a second (of squared gradients) of its square. Far past any
// trained model's (gradient clipping keeps them near 1), and small enough that a sum over 65,535
// islands stays finite in fp32 and bf16.
inline constexpr float kMomentMaxAbs[kMomentChannels] = {1e6f, 1e12f};
// Why moment values[0, count), elements [begin, begin + count) of the moment layout of a fragment
// of n elements, are not plausible (non-finite, past kMomentMaxAbs, a negative second moment);
// "" when they are.
std::string MomentValuesProblem(const float* values, uint64_t begin, uint64_t count, uint64_t n);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_MOMENT_VALUES_H_
