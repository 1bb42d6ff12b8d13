// Streaming DiLoCo's fragments (arXiv 2501.18512): the model's parameters split into P groups of
// transformer blocks, each synchronized every H inner steps at its own offset, so that at most one
// fragment is in flight at a time and peak bandwidth falls by P. Every island derives the same plan
// and schedule from (the parameters' groups, P, pattern, H); which parameters are which block's is
// the model family's to say (inner/model/plan.h), not this file's.
#ifndef ATOLL_OUTER_BASE_FRAGMENTS_H_
#define ATOLL_OUTER_BASE_FRAGMENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace atl::outer {

enum class FragmentPattern {
  kStrided,     // block l -> fragment l mod P
  kSequential,  // block l -> fragment floor(l * P / L): contiguous runs of blocks
};

absl::StatusOr<FragmentPattern> ParseFragmentPattern(const std::string& name);
// outer.fragment_pattern (compression/config_value.h).
absl::Status ParseConfigValue(const std::string& text, FragmentPattern* value);
std::string ConfigValueText(FragmentPattern value);

struct FragmentPlan {
  // For each fragment, the indices (into `names`) of its parameters, in model order.
  std::vector<std::vector<size_t>> parameters;
  std::vector<uint32_t> fragment_of;  // per parameter
};

// `groups`: each parameter's group (its transformer block, in model order; -1: a model without
// blocks), as the model's plan gives them (inner::FragmentGroups: the embeddings with block 0, the
// final norm and the head with the last block). Refuses P < 1 or more fragments than groups.
absl::StatusOr<FragmentPlan> PlanFragments(const std::vector<int>& groups, int num_fragments,
                                           FragmentPattern pattern);
// The groups of a model without blocks (a module atoll does not build, e.g. from Python): the
// parameters (their sizes, in order) in contiguous runs of about equal elements, at most
// `num_fragments` of them, so that the sequential pattern makes fragments of about equal size.
std::vector<int> ContiguousGroups(const std::vector<uint64_t>& numels, int num_fragments);

// How often the islands sync before the run settles on its H (both off by default):
//   warm start: the first `warm_start_steps` steps are rounds of one step each, every fragment,
//     applied at once (tau 0, alpha 0) as a plain average: the synchronous data-parallel start of
//     the original DiLoCo protocol (arXiv 2311.08105), counted in the run's steps;
//   early H: then every fragment syncs every `early_sync_every` steps for `early_sync_steps` steps
//     (small H while the loss falls fast and the islands drift apart fastest).
struct SyncPhases {
  int64_t warm_start_steps = 0;
  int early_sync_every = 0;      // 0: no early phase (early_sync_steps ignored)
  int64_t early_sync_steps = 0;  // a multiple of early_sync_every
  // A warm-start round other than the last: one of the quick rounds whose console lines are
  // summarised (the coordinator's and the islands').
  bool QuickRound(uint64_t round) const { return int64_t(round) + 1 < warm_start_steps; }
};

// Fragment p syncs after inner steps t > 0 with t = t_p (mod H), t_p = floor(p * H / P): the
// offsets spread the fragments evenly over H. With P = 1 this is plain DiLoCo (every H steps).
// Steps of the early phases (SyncPhases) come first: there every fragment is due together, and
// the schedule above runs from their end.
class SyncSchedule {
 public:
  SyncSchedule(int sync_every, int num_fragments, SyncPhases phases = {});
  int offset(int fragment) const;
  // Fragments due after `step` inner steps have completed, in increasing order.
  std::vector<uint32_t> DueAfter(int64_t step) const;
  // The step after which fragment f pushes its round `round` (0-based).
  int64_t DueStep(int fragment, uint64_t round) const;
  // The first due step of fragment f after `step`.
  int64_t NextDue(int fragment, int64_t step) const;
  // How many rounds fragment f pushes after steps in (0, steps].
  uint64_t RoundsUntil(int fragment, int64_t steps) const;
  // Rounds of the warm start (plain averages), the same for every fragment.
  uint64_t warm_start_rounds() const { return uint64_t(phases_.warm_start_steps); }
  bool WarmStartRound(uint64_t round) const { return round < warm_start_rounds(); }
  // Where an island resumes when the service's fragments stand at `rounds` (a rejoin): a step
  // after which every fragment's next push is that round's, when there is one (the latest round
  // start); else, when the fragments disagree (a shard of a sharded service went back to its
  // durable state), the earliest round start, so that no fragment skips a round.
  int64_t ResumeStep(const std::vector<uint64_t>& rounds) const;
  // The step round `round` of fragment f starts from (the island's step when it joins in it).
  int64_t RoundStart(int fragment, uint64_t round) const;
  int sync_every() const { return h_; }
  int64_t early_end() const { return early_end_; }  // the step the warm start and early phases end at
  int num_fragments() const { return p_; }
  const SyncPhases& phases() const { return phases_; }

 private:
  int h_, p_;
  SyncPhases phases_;
  int64_t early_end_;      // the step the early phases end at
  uint64_t early_rounds_;  // their rounds
};

// Refuses phases that do not fit: negative lengths, an early phase that is not a whole number of
// its rounds, names the outer.* keys.
absl::Status Validate(const SyncPhases& phases);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_FRAGMENTS_H_
