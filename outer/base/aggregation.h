// How the service combines the islands' pseudo-gradients of a round into one outer gradient,
// reading each contribution (kept encoded) window by window and folding it into the window's sums
// at once: memory is a few windows per thread, whatever the number of islands. Deterministic: contributions are taken in the order given (island-id order),
// ties are broken by that order, so the result never depends on arrival order.
//
//   mean          token-weighted mean (DiLoCo)
//   clipped_mean  each contribution's L2 norm clipped to clip_multiple x the median norm of the
//                 round, then the token-weighted mean
//   trimmed_mean  per coordinate, the k largest and k smallest values dropped
//                 (k = floor(trim_fraction x M), at most (M - 1) / 2), the rest averaged unweighted
//   median        per coordinate median (mean of the two middle values for even M): the trimmed
//                 mean with k = (M - 1) / 2
// The robust rules weigh islands equally: a weight a peer states itself must not decide a robust
// statistic.
#ifndef ATOLL_OUTER_BASE_AGGREGATION_H_
#define ATOLL_OUTER_BASE_AGGREGATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "outer/base/copies.h"
#include "outer/base/payload.h"
#include "outer/base/scoring.h"
#include "outer/base/worker_pool.h"

namespace atl::outer {

enum class AggregationRule { kMean, kClippedMean, kTrimmedMean, kMedian };
absl::StatusOr<AggregationRule> ParseAggregationRule(const std::string& name);
const char* AggregationRuleName(AggregationRule rule);
// outer.aggregation (compression/config_value.h).
absl::Status ParseConfigValue(const std::string& text, AggregationRule* value);
std::string ConfigValueText(AggregationRule value);

struct AggregationOptions {
  AggregationRule rule = AggregationRule::kMean;
  double clip_multiple = 2.0;   // clipped_mean
  double trim_fraction = 0.25;  // trimmed_mean
  CopyOptions copies;           // every rule: copies weigh as one (outer/base/copies.h)
};

struct ContributionRef {
  std::string island;
  uint64_t tokens = 0;  // its weight: its share of the mean is tokens / the sum of all tokens
  double norm = 0;      // L2 norm of the decoded contribution
  const EncodedPayload* payload = nullptr;
  // The mean rules scale its values by this within its share (a late contribution's cap,
  // Rounds::BoundLateShares): what it gives up goes to no one else.
  double discount = 1.0;
};

// What a robust rule did to whom, for the round record and the metrics.
struct AggregationReport {
  std::vector<std::string> clipped;          // clipped_mean: islands whose norm was clipped
  std::map<std::string, double> trimmed;     // trimmed_mean/median: share of coordinates dropped
  std::vector<std::string> outliers;         // islands dropped far more often than chance
  // mean and clipped_mean: each contribution's scale, in order (1, or its clip factor).
  std::vector<double> scales;
  CopyReport copies;  // WeighCopies
  ScoreReport scores;  // outer.scoring: each island's probe, reputation and weight
};

// Writes the outer gradient of elements [0, n) into out[n]. Every payload must cover [0, n).
// Spans of elements run in parallel on `pool` when given; the result is the same either way.
// The fewest contributions with which the rule outvotes or bounds one faulty island (the mean
// never does: 1): clipped_mean and median need 3 (with 2 the median norm or value is their
// average, which the faulty one moves), trimmed_mean the M >= 3 with floor(trim_fraction x M) >= 1.
// 0 when no M will do (trimmed_mean with trim_fraction 0).
int SmallestIslands(const AggregationOptions& options);
// Why the rule cannot act for `islands` contributions (named, with the smallest M), or OK.
absl::Status CheckActs(const AggregationOptions& options, int islands);

// The mean rules' fold alone, over elements [first, first + n) of the fragment into out[n]: in the
// order given, sum(tokens x (scale[i] x value)) / sum(tokens) in double, stored as fp32. Each
// element's result depends on that element alone, so a range holds the very bits the whole
// fragment's fold holds there (a relayed update is computed so on each rank's ranges:
// outer/base/update_recipe.h). The payloads must cover the range.
absl::Status CombineMean(const std::vector<ContributionRef>& contributions,
                         const std::vector<double>& scale, uint64_t first, uint64_t n, float* out,
                         WorkerPool* pool = nullptr);

absl::Status Aggregate(const AggregationOptions& options,
                       const std::vector<ContributionRef>& contributions, uint64_t n, float* out,
                       AggregationReport* report, WorkerPool* pool = nullptr);

// A sparse vector (an outer gradient, an update): the coordinates it holds, ascending, and its
// values there; every other coordinate is +0. In pieces of disjoint index ranges, in order, each
// made on its own (a task of a fold, a chunk of an update); their storage is reused from round
// to round.
struct SparseGradient {
  struct Piece {
    std::vector<uint64_t> index;
    std::vector<float> value;
  };
  std::vector<Piece> pieces;
  uint64_t span = 0;  // when not 0: piece t holds only indices in [t x span, (t + 1) x span)
  // Empties every piece (keeping its storage) and makes `n` of them, of `span` elements if given.
  void Reset(size_t n, uint64_t span = 0);
  size_t size() const;
};
// Whether the rule folds whole contributions (mean, clipped_mean), so that its result is a
// weighted sum of them (relayed updates, sparse folds); the per-coordinate rules are not.
inline bool FoldsWholeContributions(AggregationRule rule) {
  return rule == AggregationRule::kMean || rule == AggregationRule::kClippedMean;
}
// Whether the round aggregates sparsely: a mean rule (a fold of whole contributions) over sparse
// contributions (the median and the trimmed mean look at every coordinate's zeros too).
bool AggregatesSparsely(const AggregationOptions& options,
                        const std::vector<ContributionRef>& contributions);
// Aggregate for such a round into *out, in time proportional to the values kept, not to n: at
// every index the bits Aggregate writes there (the same fold in the same order: the zeros it adds
// elsewhere change no sum), and the same report.
absl::Status AggregateSparse(const AggregationOptions& options,
                             const std::vector<ContributionRef>& contributions, uint64_t n,
                             AggregationReport* report, SparseGradient* out,
                             WorkerPool* pool = nullptr);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_AGGREGATION_H_
