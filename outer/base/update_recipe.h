// Relayed updates. When a round's outer step is linear in the averaged pseudo-gradient (outer SGD,
// SparseLoCo's step; or a warm start's plain average), every copy of the global parameters can make
// the update itself from the round's contributions: u = lr x CombineMean(contributions). The
// service then relays the contributions as they arrived (verified, still encoded) with a recipe
// (whose, their weights, the lr) instead of encoding u, and a rank that pushed receives only the
// other islands' contributions: with sparse ones that is M - 1 pushes, against the union of all M
// (its own included) re-encoded in FP4, and it is exact (u is never quantized). SparseLoCo
// all-gathers its contributions the same way (arXiv 2508.15706).
//
// Every copy computes u with the same functions (CombineMean, LinearStep) on the same bytes, in the
// recipe's order, element by element, with no fused multiply-add (outer/ and compression/ are
// built with -ffp-contract=off): a rank's range holds the bits the whole fragment holds there, on
// any machine.
#ifndef ATOLL_OUTER_BASE_UPDATE_RECIPE_H_
#define ATOLL_OUTER_BASE_UPDATE_RECIPE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "atoll/v1/outer.pb.h"
#include "compression/codec_spec.h"
#include "outer/base/payload.h"
#include "outer/base/worker_pool.h"

namespace atl::outer {

struct UpdateTerm {
  std::string island;
  uint64_t tokens = 0;
  double scale = 1.0;  // 1, or clipped_mean's clip factor
};

// u = lr x g, g = sum(tokens x (scale x value)) / sum(tokens) over the terms in order.
struct UpdateRecipe {
  std::vector<UpdateTerm> terms;
  float lr = 0;
};

// Terms a recipe may hold (islands of a round).
inline constexpr size_t kMaxRecipeTerms = 4096;

pb::UpdateRecipe ToProto(const UpdateRecipe& recipe);
// The recipe a service sent, checked: 1 to kMaxRecipeTerms terms of distinct valid island names,
// tokens > 0, scales in [0, 1], a finite lr. INVALID_ARGUMENT naming the problem otherwise.
absl::StatusOr<UpdateRecipe> RecipeOf(const pb::UpdateRecipe& proto);

// Elements [first, first + n) of the update into u[n]; payloads[i] holds the contribution of
// terms[i] over (at least) that range.
absl::Status RecipeUpdate(const UpdateRecipe& recipe,
                          const std::vector<const EncodedPayload*>& payloads, uint64_t first,
                          uint64_t n, float* u, WorkerPool* pool = nullptr);

// Whether relaying the contributions of `contributors` islands takes no more bytes, to an island
// that pushed (M - 1 of them), than the encoded update they would make (UpdateBytesAtMost). Only
// sparse contributions are relayed: a dense update is never larger than one push.
bool RelayIsSmaller(const compression::CodecSpec& contributions, uint32_t contributors, uint64_t n);

// The most bytes an island that pushed receives of a round of n elements: relayed contributions
// when the outer step is linear and relaying is smaller, else the encoded update.
size_t DownBytesAtMost(const compression::CodecSpec& contributions, uint32_t contributors,
                       uint64_t n, bool linear_step);

// An island rank's side of a relayed update of elements [begin, end) of a fragment: takes the
// messages of the update's stream (each with the recipe, most with a slice of one term's
// contribution), checks each chunk (CheckChunk: run, round, fragment, the run's codec, sizes,
// checksum; then order) before keeping it, and then makes u from the recipe. `own`, when given, is this
// island's own contribution to the round (what it pushed), which the service left out.
class RelayReceiver {
 public:
  RelayReceiver(PayloadId id, compression::CodecSpec codec, uint64_t fragment_elements,
                uint64_t begin, uint64_t end, const EncodedPayload* own);
  RelayReceiver(RelayReceiver&&) = default;

  // INVALID_ARGUMENT naming the problem (a recipe that changes or is malformed, a chunk of an
  // island the recipe does not name or that this island holds itself); a refused message leaves
  // the receiver as it was.
  absl::Status Add(pb::UpdateChunk&& message);
  // u[end - begin] once every term's contribution is complete; else the problem, named.
  absl::StatusOr<std::vector<float>> Finish() const;

 private:
  PayloadId id_;  // run, round, fragment (each term's island is its own)
  compression::CodecSpec codec_;
  uint64_t fragment_elements_, begin_, end_;
  const EncodedPayload* own_;
  std::string recipe_bytes_;  // the first message's recipe, serialized: every message repeats it
  UpdateRecipe recipe_;
  // Per term, its chunks as they arrived: in order, ascending, never overlapping (a contribution
  // joined from a sharded island's ranks has chunk ends anywhere).
  struct Received {
    EncodedPayload payload;
    uint32_t num_chunks = 0;  // from its first chunk; 0: none yet
  };
  std::vector<Received> received_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_UPDATE_RECIPE_H_
