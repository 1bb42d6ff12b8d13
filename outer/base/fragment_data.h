// The data of one fragment that a commit changes: its fp32 global parameters and their outer
// optimizer, with the steps of a commit done span by span on a worker pool, so that memory beyond
// the parameters and the optimizer's state is a window per thread. Not thread-safe: the service
// holds the fragment's data lock around every use.
#ifndef ATOLL_OUTER_BASE_FRAGMENT_DATA_H_
#define ATOLL_OUTER_BASE_FRAGMENT_DATA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/payload.h"
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

  // The outer update of the averaged outer gradient g, encoded with `codec` (the chunks every copy
  // of the parameters applies), without changing anything. INVALID_ARGUMENT when the update is not
  // finite or would make a parameter non-finite once decoded and subtracted.
  absl::StatusOr<std::vector<pb::Chunk>> PrepareUpdate(const float* g, const PayloadId& id,
                                                       const compression::CodecSpec& codec,
                                                       size_t chunk_bytes, WorkerPool* pool) const;
  // Advances the optimizer by g and subtracts the update that PrepareUpdate made of it (decoded
  // chunk by chunk, as the islands decode it).
  void Apply(const float* g, const std::vector<pb::Chunk>& update, WorkerPool* pool);
  // For a linear step (optimizer().linear()): subtracts u = LinearStep(lr, g) itself, the update
  // each copy makes from relayed contributions (outer/base/update_recipe.h). INVALID_ARGUMENT, with
  // nothing changed, when u would make a parameter non-finite.
  absl::Status StepLinear(const float* g, WorkerPool* pool);

  uint64_t Hash() const;                                 // XXH64 of the parameters
  uint64_t RangeHash(uint64_t begin, uint64_t end) const;  // of elements [begin, end)
  double Norm(WorkerPool* pool) const;                   // L2, summed span by span in order

  // Replaces the parameters and the optimizer (sizes checked by the caller).
  void Reset(std::vector<float> params, std::unique_ptr<OuterOptimizer> optimizer);

 private:
  std::vector<float> params_;
  std::unique_ptr<OuterOptimizer> optimizer_;
};

// The update that changes nothing, encoded chunk by chunk (rounds in which every contribution was
// left out still travel, so that islands apply them like any other).
std::vector<pb::Chunk> ZeroUpdate(const PayloadId& id, const compression::CodecSpec& codec,
                                  uint64_t n, size_t chunk_bytes);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_FRAGMENT_DATA_H_
