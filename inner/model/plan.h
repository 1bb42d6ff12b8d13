// A model family's parallelization plan (torchtitan's parallelize_module plans, in C++): which of
// its linear layers are column- or row-parallel, where its transformer blocks are (FSDP units and
// pipeline stages are the embeddings, each block and the head; Streaming DiLoCo's fragments are
// groups of blocks), all derived from parameter names. inner/parallel/ applies a plan to a plain
// model and knows no architecture. Torch-free.
//
// Canonical flat order (shared by the outer sync, checkpoints and the service's state): every
// parameter row-major, except the weights of row-parallel layers, which flatten input-major (as
// their transposes do). Then the part of any parameter that a tensor-parallel rank holds is at
// most `parts` ranges of that order, whatever the degree.
#ifndef ATOLL_INNER_MODEL_PLAN_H_
#define ATOLL_INNER_MODEL_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace atl::inner {

enum class TpStyle {
  kReplicated,  // whole on every tensor-parallel rank
  kColumn,      // output rows split over the ranks (in `parts` equal parts split alike: q, k, v)
  kRow,         // input columns split; the bias whole (added once after the sum)
};

struct TpRule {
  std::string module;  // a module's name; "*" stands for a block index ("blocks.*.attn.qkv")
  TpStyle style = TpStyle::kReplicated;
  int parts = 1;
};

struct ParallelPlan {
  // The container of the transformer blocks: block l's parameters are named "<blocks>.<l>.*".
  std::string blocks = "blocks";
  // The modules before the blocks (the embeddings' unit); every other parameter outside the
  // blocks belongs to the head's unit.
  std::vector<std::string> embeddings;
  std::vector<TpRule> tensor_parallel;
};

// What a parameter is under the plan.
struct ParamPlan {
  TpStyle style = TpStyle::kReplicated;  // the weight's; a row-parallel layer's bias is replicated
  int parts = 1;
  int block = -1;  // its transformer block, -1 outside them
  // Replicated inside a block: under sequence parallelism it sees the rank's slice of the
  // sequence only, so its gradient is a partial sum over the tensor-parallel ranks.
  bool sequence_partial = false;
  bool input_major = false;  // flattens input-major in the canonical order (row-parallel weights)
};
ParamPlan PlanOf(const ParallelPlan& plan, const std::string& param);

// FSDP unit / pipeline unit of a parameter: 0 the embeddings, 1..n_layer the blocks, n_layer + 1
// the head (everything after the blocks).
int UnitOf(const ParallelPlan& plan, const std::string& param, int n_layer);
// Streaming DiLoCo's fragment group of each parameter (names in model order): its block, the
// embeddings with block 0, what follows the blocks with the last block. -1 for a model without
// blocks.
std::vector<int> FragmentGroups(const ParallelPlan& plan, const std::vector<std::string>& names);

// The shape of a parameter (whole: `shape`) on a tensor-parallel rank of `size`.
std::vector<int64_t> TpLocalShape(const ParamPlan& p, const std::vector<int64_t>& shape, int size);
// The ranges (offset, count) of the parameter's canonical flat order that rank `rank` of `size`
// holds, in the order of its own part's canonical flat order (at most `parts`).
std::vector<std::pair<int64_t, int64_t>> TpRanges(const ParamPlan& p,
                                                   const std::vector<int64_t>& shape, int rank,
                                                   int size);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_PLAN_H_
