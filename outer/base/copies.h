// Contributions that copy another's: an island that sends another island's payload (as it is,
// scaled, or lightly changed) to collect weight without training. The service cannot tell which
// one trained, so a group of such contributions weighs as one of them. Judged on a sample of the
// fragment's windows chosen by a seed the peers do not know:
//   sparse payloads: the kept index sets of two contributions share at least `overlap` of the
//     smaller (independent top-k selections share about the density; Templar slashes at 40%)
//   dense payloads: the cosine of two contributions' values is at least `cosine`, once the
//     direction of the other contributions' mean (with 3 or more) is projected out of both
#ifndef ATOLL_OUTER_BASE_COPIES_H_
#define ATOLL_OUTER_BASE_COPIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "outer/base/payload.h"

namespace atl::outer {

// Off by default until a long clean run shows no honest pair near the thresholds (4 islands on
// micro, 600 steps: at most 0.497 sparse, 0.447 dense); 0.9 and 0.99 are the values tested.
struct CopyOptions {
  double overlap = 0;     // sparse (0: off)
  double cosine = 0;      // dense (0: off)
  uint32_t windows = 64;  // windows of kCopyWindow elements sampled per round
};
inline constexpr uint64_t kCopyWindow = 4096;

struct CopyReport {
  std::vector<std::vector<std::string>> groups;  // islands flagged as copies of one another
  double most_similar = 0;  // the largest overlap (sparse) or cosine (dense) of two contributions
};

struct ContributionRef;  // outer/base/aggregation.h

// Finds the groups of copies among the contributions (windows of [0, n) sampled by `seed`) and
// divides each member's tokens by its group's size (at least 1 token). A contribution that cannot
// be read is left to the aggregation to refuse.
void WeighCopies(const CopyOptions& options, std::vector<ContributionRef>& contributions,
                 uint64_t n, uint64_t seed, CopyReport* report);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_COPIES_H_
