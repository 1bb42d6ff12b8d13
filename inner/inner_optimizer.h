// The inner optimizer a trainer steps with, over the parameter shards its rank holds
// (inner/parallel/fsdp.h): AdamW on every parameter (optim.name = "adamw"), or Muon on the
// blocks' 2-D matrices and AdamW on the rest (optim.name = "muon", inner/muon.h).
//
// Its state is named per shard, so that checkpoints address it by the parameters' stable names
// ("optim/<kind>/<param>") and reshard it on load like the parameters.
#ifndef ATOLL_INNER_INNER_OPTIMIZER_H_
#define ATOLL_INNER_INNER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/adamw.h"
#include "inner/model_config.h"
#include "inner/train_config.h"

namespace atl::inner {

namespace parallel {
class FsdpModel;
}

class InnerOptimizer {
 public:
  virtual ~InnerOptimizer() = default;
  // One update at learning rate lr from the shards' gradients. Every rank of the island's mesh
  // calls it together (Muon gathers its matrices); no host sync.
  virtual absl::Status Step(double lr) = 0;
  virtual void ZeroGrad() = 0;
  // Forgets the state (an island that saw a non-finite loss starts its moments again).
  virtual void Reset() = 0;
  virtual int64_t step() const = 0;
  virtual void SetStep(int64_t step) = 0;
  // The state of shard i of the model's shards(): its kinds ("exp_avg", "exp_avg_sq" for AdamW,
  // "momentum" for Muon's matrices) with tensors shaped as the shard's value, written in place by
  // whoever loads a checkpoint.
  virtual std::vector<NamedTensor> ShardState(size_t i) const = 0;
};

// The optimizer optim.name names, over `model`'s shards.
absl::StatusOr<std::unique_ptr<InnerOptimizer>> NewInnerOptimizer(const OptimConfig& optim,
                                                                 const ModelConfig& config,
                                                                 parallel::FsdpModel& model);

}  // namespace atl::inner

#endif  // ATOLL_INNER_INNER_OPTIMIZER_H_
