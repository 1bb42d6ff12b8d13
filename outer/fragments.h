// Streaming DiLoCo's fragments (arXiv 2501.18512): the model's named parameters split into P
// groups of transformer blocks, each synchronized every H inner steps at its own offset, so that
// at most one fragment is in flight at a time and peak bandwidth falls by P.
//
// Placement rule for parameters outside the blocks: embeddings (tok_emb, pos_emb) travel with the
// fragment of block 0, the final LayerNorm and the head (ln_f, head) with the fragment of the last
// block. Every island derives the same plan and schedule from (names, P, pattern, H).
#ifndef ATOLL_OUTER_FRAGMENTS_H_
#define ATOLL_OUTER_FRAGMENTS_H_

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

struct FragmentPlan {
  // For each fragment, the indices (into `names`) of its parameters, in model order.
  std::vector<std::vector<size_t>> parameters;
  std::vector<uint32_t> fragment_of;  // per parameter
};

// `names` in model order; blocks are recognized as "blocks.<l>.". Refuses P < 1 or more fragments
// than blocks, and names that fit neither the blocks nor the placement rule.
absl::StatusOr<FragmentPlan> PlanFragments(const std::vector<std::string>& names,
                                           int num_fragments, FragmentPattern pattern);

// Fragment p syncs after inner steps t > 0 with t = t_p (mod H), t_p = floor(p * H / P): the
// offsets spread the fragments evenly over H. With P = 1 this is plain DiLoCo (every H steps).
class SyncSchedule {
 public:
  SyncSchedule(int sync_every, int num_fragments);
  int offset(int fragment) const;
  // Fragments due after `step` inner steps have completed, in increasing order.
  std::vector<uint32_t> DueAfter(int64_t step) const;
  // The step after which fragment f pushes its round `round` (0-based).
  int64_t DueStep(int fragment, uint64_t round) const;
  // Where an island resumes when the service's fragments stand at `rounds` (a rejoin): a step
  // after which every fragment's next push is that round's, when there is one (the latest round
  // start); else, when the fragments disagree (a shard of a sharded service went back to its
  // durable state), the earliest round start, so that no fragment skips a round.
  int64_t ResumeStep(const std::vector<uint64_t>& rounds) const;
  int sync_every() const { return h_; }
  int num_fragments() const { return p_; }

 private:
  int h_, p_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_FRAGMENTS_H_
