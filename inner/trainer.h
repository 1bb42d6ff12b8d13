// One island's inner training: model, data stream, inner optimizer (AdamW or Muon), schedule.
// `Trainer::QueueStep()` is one optimizer step (micro-batch accumulation, clipping, update) that
// never waits for the device: its loss and gradient norm stay there until `TakeStats()` brings
// those of all the steps queued since over in one copy. inner/loop.h's RunLoop is the loop around it.
//
// The same trainer runs one rank or many: the model is an FsdpModel over the island's mesh (one rank
// is its case N = 1). Each data-parallel rank takes its slice of every global micro-batch
// (train.batch_size sequences per rank), so N ranks see exactly the batches one rank would with N
// times the batch. Every rank of an island must call Step and Evaluate together.
//
// Threading: a Trainer belongs to the training thread. Other threads may read parameters only
// through snapshots that the training thread hands over.
#ifndef ATOLL_INNER_TRAINER_H_
#define ATOLL_INNER_TRAINER_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/data.h"
#include "inner/inner_optimizer.h"
#include "inner/loop.h"
#include "inner/model.h"
#include "inner/trainer_config.h"

namespace atl::inner {

// Linear warmup, then cosine decay to lr * min_lr_ratio at `total_steps`.
double LearningRate(const OptimConfig& config, int64_t step, int64_t total_steps);

// Elements [offset, offset + values.numel()) of a flattened tensor of `shape`: a rank exports the
// parts of the parameters and moments it owns; one rank owns whole tensors.
struct TensorSlice {
  // "model/<param>", "optim/<kind>/<param>" (kind: exp_avg, exp_avg_sq; Muon's momentum)
  std::string name;
  at::Tensor values;  // 1-D
  int64_t offset = 0;
  std::vector<int64_t> shape;
};

// Everything needed to continue bit-identically; serialized by src/store/checkpoint. The slices of any
// set of ranks of any sharding: ImportState takes what it owns from whichever slices hold it.
struct TrainerState {
  int64_t step = 0;
  int64_t adam_step = 0;
  DataCursor cursor;
  std::vector<TensorSlice> tensors;
  at::Tensor rng_state;  // default CPU generator (dropout)
};

namespace parallel {
class DeviceMesh;
class FsdpModel;
}  // namespace parallel

class Trainer : public StepSource {
 public:
  // stream / num_streams select this island's disjoint share of the training windows. `mesh`:
  // the island's ranks (nullptr: one rank); it must outlive the trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerConfig& config,
                                                         std::shared_ptr<const Dataset> data,
                                                         int stream = 0, int num_streams = 1,
                                                         parallel::DeviceMesh* mesh = nullptr);
  ~Trainer();

  // One optimizer step, queued on the device without waiting for it (no host sync): its stats
  // pend until TakeStats. Errors come from the island's collectives (a rank gone): the island
  // cannot go on.
  absl::Status QueueStep() override;
  // The stats of the steps queued since the last TakeStats, in order, their losses and gradient
  // norms in one copy from the device (the step's only wait for it); the wait counts in their
  // compute_s, in equal parts. An error is the device's (a kernel that failed).
  absl::StatusOr<std::vector<StepStats>> TakeStats() override;
  int pending_steps() const { return int(pending_.size()); }
  // QueueStep and TakeStats: one step whose stats are wanted at once. No stats may be pending.
  absl::StatusOr<StepStats> Step();
  absl::StatusOr<EvalStats> Evaluate();

  int64_t step() const override { return step_; }
  // Moves the learning-rate schedule to `position` for the next step (it advances by one per step
  // from there). Async islands follow the run's global progress instead of their own step count.
  // Not part of the checkpointed state.
  void SetSchedulePosition(int64_t position) { schedule_shift_ = position - step_; }
  // Scales the learning rate of the next `steps` steps by 1/steps, 2/steps, ..., 1: a short warmup
  // for fresh optimizer state (an island joining a run that is under way). Not checkpointed.
  void RampLearningRate(int64_t steps) {
    ramp_steps_ = steps;
    ramp_done_ = 0;
  }
  // An island joining a run late, or rejoining after the service lost rounds, continues at the
  // run's step: the step counter (and with it the schedule) moves there; model, optimizer state
  // and data cursor are untouched.
  void SetStep(int64_t step) { step_ = step; }
  // Tokens of one step of the whole island (all data-parallel ranks).
  int64_t tokens_per_step() const;
  int64_t tokens() const { return step_ * tokens_per_step(); }
  const TrainConfig& train_config() const { return train_; }
  const OptimConfig& optim_config() const { return optim_; }
  // The module; with several ranks its parameters hold data only while a unit is gathered.
  CausalLm& model();
  parallel::FsdpModel& sharded() { return *fsdp_; }
  parallel::DeviceMesh& mesh() { return *mesh_; }
  InnerOptimizer& optimizer() { return *optimizer_; }
  const BatchSampler& sampler() const { return sampler_; }

  // This rank's parameters and moments (copies on the CPU).
  TrainerState ExportState() const;
  // All-or-nothing: a state that does not fit this model (or does not hold every element this
  // rank owns) leaves the trainer untouched. Takes its parts from slices of any sharding.
  absl::Status ImportState(const TrainerState& state);

 private:
  Trainer(const TrainerConfig& config, std::shared_ptr<const Dataset> data, BatchSampler sampler);

  const TrainerConfig config_;  // train.device resolved to this rank's
  const ModelConfig& model_config_ = config_.model;
  const OptimConfig& optim_ = config_.optim;
  const TrainConfig& train_ = config_.train;
  std::shared_ptr<const Dataset> data_;
  BatchSampler sampler_;
  std::unique_ptr<parallel::DeviceMesh> own_mesh_;  // one rank, when none is given
  parallel::DeviceMesh* mesh_ = nullptr;
  std::unique_ptr<parallel::FsdpModel> fsdp_;
  std::unique_ptr<InnerOptimizer> optimizer_;
  struct Pending {
    StepStats stats;    // all but loss and grad_norm
    at::Tensor values;  // [loss, grad_norm] in double, on the device
  };
  std::vector<Pending> pending_;
  int64_t step_ = 0;
  int64_t schedule_shift_ = 0;
  int64_t ramp_steps_ = 0, ramp_done_ = 0;
};

}  // namespace atl::inner

#endif  // ATOLL_INNER_TRAINER_H_
