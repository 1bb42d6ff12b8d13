// One island's inner training: model, data stream, AdamW, schedule. `Trainer::Step()` is one
// optimizer step (micro-batch accumulation, clipping, update); `RunLoop` is the loop around it.
// Nothing here knows about the network: the outer sync plugs in through LoopObserver.
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
#include "inner/adamw.h"
#include "inner/data.h"
#include "inner/model.h"

namespace atl::inner {

struct OptimConfig {
  double lr = 1e-3;            // peak learning rate
  double min_lr_ratio = 0.1;   // cosine decays to lr * min_lr_ratio at train.steps
  int64_t warmup_steps = 100;  // linear warmup from lr / warmup_steps
  double grad_clip = 1.0;      // max global L2 norm; 0 disables clipping
  AdamWOptions adamw;
};

struct TrainConfig {
  int64_t steps = 1000;  // optimizer steps (the schedule's horizon)
  int batch_size = 16;   // sequences per micro-batch
  int grad_accum = 1;    // micro-batches per optimizer step
  int64_t eval_every = 100;
  int eval_batches = 8;  // fixed validation micro-batches
  uint64_t seed = 42;    // dropout and other runtime randomness
  int threads = 0;       // intra-op threads; 0 = torch's default (all cores)
  std::string device = "cpu";
};

absl::Status Validate(const OptimConfig& config, const TrainConfig& train);
absl::Status Validate(const TrainConfig& config);

// Linear warmup, then cosine decay to lr * min_lr_ratio at `total_steps`.
double LearningRate(const OptimConfig& config, int64_t step, int64_t total_steps);

struct StepStats {
  int64_t step = 0;    // steps completed, counting this one
  double loss = 0;     // mean training loss of the step's micro-batches (nats)
  double lr = 0;
  double grad_norm = 0;  // before clipping
  int64_t tokens = 0;    // tokens this trainer has consumed in total
  double compute_s = 0;  // wall seconds of the step
};

struct EvalStats {
  double loss = 0;        // mean validation loss (nats per token)
  double bits = 0;        // loss in bits per token
  bool per_byte = false;  // tokens are bytes (text data): `bits` is bits per byte
};

// Everything needed to continue bit-identically; serialized by src/checkpoint.
struct TrainerState {
  int64_t step = 0;
  int64_t adam_step = 0;
  DataCursor cursor;
  std::vector<NamedTensor> tensors;  // "model/<param>", "optim/exp_avg/<param>", ...
  at::Tensor rng_state;              // default CPU generator (dropout)
};

class Trainer {
 public:
  // stream / num_streams select this trainer's disjoint share of the training windows.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const ModelConfig& model,
                                                         const OptimConfig& optim,
                                                         const TrainConfig& train,
                                                         std::shared_ptr<const Dataset> data,
                                                         int stream = 0, int num_streams = 1);
  ~Trainer();

  StepStats Step();
  EvalStats Evaluate();

  int64_t step() const { return step_; }
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
  int64_t tokens_per_step() const;
  int64_t tokens() const { return step_ * tokens_per_step(); }
  const TrainConfig& train_config() const { return train_; }
  Gpt& model() { return model_; }
  AdamW& optimizer() { return *adamw_; }
  const BatchSampler& sampler() const { return sampler_; }

  TrainerState ExportState() const;  // tensors are copies on the CPU
  // All-or-nothing: a state that does not fit this model leaves the trainer untouched.
  absl::Status ImportState(const TrainerState& state);

 private:
  Trainer(const ModelConfig& model, const OptimConfig& optim, const TrainConfig& train,
          std::shared_ptr<const Dataset> data, BatchSampler sampler);

  ModelConfig model_config_;
  OptimConfig optim_;
  TrainConfig train_;
  std::shared_ptr<const Dataset> data_;
  BatchSampler sampler_;
  Gpt model_{nullptr};
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::unique_ptr<AdamW> adamw_;
  at::Tensor inputs_, targets_;  // reused micro-batch buffers (CPU)
  int64_t step_ = 0;
  int64_t schedule_shift_ = 0;
  int64_t ramp_steps_ = 0, ramp_done_ = 0;
};

// Called after every step; returning an error stops the loop with it.
class LoopObserver {
 public:
  virtual ~LoopObserver() = default;
  virtual absl::Status OnStep(const StepStats& step, const EvalStats* eval) = 0;
};

// Steps `trainer` until it has completed `until_step` steps, evaluating every train.eval_every
// steps and at the last one (unless `evaluate` is false: DiLoCo islands evaluate the global
// parameters after their outer round instead).
absl::Status RunLoop(Trainer& trainer, int64_t until_step, LoopObserver& observer,
                     bool evaluate = true);

}  // namespace atl::inner

#endif  // ATOLL_INNER_TRAINER_H_
