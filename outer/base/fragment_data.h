// The data of one fragment that a commit changes: its fp32 global parameters and their outer
// optimizer, with the steps of a commit done span by span on a worker pool, so that memory beyond
// the parameters and the optimizer's state is a window per thread. Not thread-safe: the service
// holds the fragment's data lock around every use.
#ifndef ATOLL_OUTER_BASE_FRAGMENT_DATA_H_
#define ATOLL_OUTER_BASE_FRAGMENT_DATA_H_

#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/aggregation.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/payload.h"
#include "outer/base/reused_buffers.h"
#include "outer/base/worker_pool.h"

namespace atl::outer {

class FragmentData {
 public:
  FragmentData(std::vector<float> params, const OuterOptimizerConfig& config);

  const std::vector<float>& params() const { return params_; }
  size_t size() const { return params_.size(); }
  const OuterOptimizer& optimizer() const { return *optimizer_; }
  void set_lr(double lr) { optimizer_->set_lr(lr); }
  void set_averaging(bool averaging) { optimizer_->set_averaging(averaging); }
  void RestartOptimizer() { optimizer_->Restart(); }

  // The outer update of the averaged outer gradient g, encoded with `codec` (the chunks every copy
  // of the parameters applies), without changing anything. INVALID_ARGUMENT when the update is not
  // finite or would make a parameter non-finite once decoded and subtracted.
  // With `spare`, chunk c is encoded into spare->For(c) (payload.h).
  absl::StatusOr<std::vector<pb::Chunk>> PrepareUpdate(const float* g, const PayloadId& id,
                                                       const compression::CodecSpec& codec,
                                                       size_t chunk_bytes, WorkerPool* pool,
                                                       SpareChunkData* spare = nullptr) const;
  // Advances the optimizer by g and subtracts the update that PrepareUpdate made of it (decoded
  // chunk by chunk, as the islands decode it).
  void Apply(const float* g, const std::vector<pb::Chunk>& update, WorkerPool* pool);
  // For a linear step (optimizer().linear()): subtracts u = LinearStep(lr, g) itself, the update
  // each copy makes from relayed contributions (outer/base/update_recipe.h). INVALID_ARGUMENT, with
  // nothing changed, when u would make a parameter non-finite.
  absl::Status StepLinear(const float* g, WorkerPool* pool);

  // PrepareUpdate and Apply (or StepLinear) for a sparse g (zero but at its indices) and a
  // linear step, in time proportional to g's values and the update's (what a sparse round
  // changed), with the very bits the dense forms make of the dense g. StepSparse returns the
  // update: made in one pass (each chunk subtracted as it is encoded) when it cannot make a
  // parameter non-finite, which its bound and the parameters' show at once; else prepared,
  // checked and applied in turn, with `scratch` holding it decoded.
  struct SparseUpdate {
    std::vector<pb::Chunk> chunks;  // what every copy applies
    SparseGradient decoded;         // a piece per chunk: what it subtracts (its kept elements)
  };
  absl::StatusOr<std::vector<pb::Chunk>> StepSparse(const SparseGradient& g, const PayloadId& id,
                                                    const compression::CodecSpec& codec,
                                                    size_t chunk_bytes, WorkerPool* pool,
                                                    SparseUpdate* scratch,
                                                    SpareChunkData* spare = nullptr);
  absl::Status StepLinearSparse(const SparseGradient& g, WorkerPool* pool);

  // Hashes (compression::ParamsHash) and the norm, kept up to date by every change above: the
  // hash of each segment between the bounds of the ranges tracked is a sum that a change updates
  // by the terms of the elements it changed (a dense change: in the pass that writes them).
  // Ranges whose hashes are asked for often (ranks' ranges) are tracked; any other range is
  // hashed when asked.
  void TrackRanges(const std::set<std::pair<uint64_t, uint64_t>>& ranges);
  uint64_t Hash() const;                                   // of the whole fragment
  uint64_t RangeHash(uint64_t begin, uint64_t end) const;  // of elements [begin, end)
  // L2. Kept as a running sum of squares: within rounding of a fresh sum, not bit for bit.
  double Norm() const;

  // Replaces the parameters and the optimizer (sizes checked by the caller).
  void Reset(std::vector<float> params, std::unique_ptr<OuterOptimizer> optimizer);

 private:
  // What a change did to the hash sums (per segment) and the sum of squares.
  struct Tally {
    std::vector<std::pair<size_t, uint64_t>> sums;  // (segment, sum of terms)
    double squares = 0;
    float max_abs = 0;  // of the values written
  };
  // Whether subtracting values of magnitude at most `max_abs` keeps every parameter finite for
  // certain (|p - d| <= bound + max_abs < FLT_MAX); else each element is checked.
  bool SurelyFinite(float max_abs) const;
  // StepSparse's checked path: the update made and checked without changing anything, then
  // subtracted.
  absl::Status PrepareSparseUpdate(const SparseGradient& g, const PayloadId& id,
                                   const compression::CodecSpec& codec, size_t chunk_bytes,
                                   WorkerPool* pool, SparseUpdate* update,
                                   SpareChunkData* spare) const;
  void ApplySparse(const SparseUpdate& update, WorkerPool* pool);
  // Hashes every segment and sums the squares again (the bounds kept if they fit).
  void Remeasure();
  size_t SegmentOf(uint64_t i) const;
  // The terms and squares of elements [first, first + count) as they are now.
  void Measure(uint64_t first, uint64_t count, Tally* tally) const;
  // Sets the sums and squares from tallies covering every element once (a dense change).
  void Replace(const std::vector<Tally>& tallies);
  // Adds tallies of differences (new minus old terms and squares) to them.
  void AddDeltas(const std::vector<Tally>& tallies);
  // p[base + offsets[j]] -= d[j] (offsets ascending), the deltas into tally.
  template <typename Index>
  void SubtractAt(uint64_t base, const Index* offsets, const float* d, size_t m, Tally* tally);
  // A sparse update's encoding: its chunks, and the chunk c of u = lr x g encoded, with what it
  // decodes to handed to `decoded` a run at a time.
  struct SparsePlan {
    PayloadId id;
    Encoding encoding;
    ChunkPlan chunks;
    float lr = 0;
  };
  absl::StatusOr<SparsePlan> PlanSparse(const PayloadId& id, const compression::CodecSpec& codec,
                                        size_t chunk_bytes) const;
  absl::StatusOr<pb::Chunk> EncodeSparseChunk(const SparseGradient& g, const SparsePlan& plan,
                                              size_t c, const compression::KeptVisitor& decoded,
                                              std::string* storage) const;

  std::vector<float> params_;
  std::unique_ptr<OuterOptimizer> optimizer_;
  std::vector<uint64_t> bounds_;  // 0 = bounds_[0] < ... < bounds_.back() = size()
  std::vector<uint64_t> sums_;    // per segment [bounds_[i], bounds_[i + 1])
  double squares_ = 0;
  float max_abs_bound_ = 0;  // >= every |parameter| (exact after a dense change)
};

// The update that changes nothing, encoded chunk by chunk (rounds in which every contribution was
// left out still travel, so that islands apply them like any other).
std::vector<pb::Chunk> ZeroUpdate(const PayloadId& id, const compression::CodecSpec& codec,
                                  uint64_t n, size_t chunk_bytes);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_FRAGMENT_DATA_H_
