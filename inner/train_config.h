// The [train], [optim] and [activation_checkpoint] sections: how an island (or `atoll train`)
// trains. Torch-free; the values are parsed and checked when the config loads.
#ifndef ATOLL_INNER_TRAIN_CONFIG_H_
#define ATOLL_INNER_TRAIN_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::inner {

// "none" (fp32) or "bf16": forward and backward under bf16 autocast, fp32 master weights,
// gradients, their reduction and AdamW state.
enum class MixedPrecision { kNone, kBf16 };
absl::Status ParseConfigValue(const std::string& text, MixedPrecision* value);
std::string ConfigValueText(MixedPrecision value);

struct TrainConfig {
  static constexpr const char* kSection = "train";
  int64_t steps = 1000;  // optimizer steps (the schedule's horizon)
  int batch_size = 16;   // sequences per micro-batch, per data-parallel rank
  int grad_accum = 1;    // micro-batches per optimizer step
  int64_t eval_every = 100;
  int eval_batches = 8;  // fixed validation micro-batches
  uint64_t seed = 42;    // dropout and other runtime randomness
  int threads = 0;       // intra-op threads; 0 = torch's default (all cores)
  std::string device = "cpu";
  MixedPrecision mixed_precision = MixedPrecision::kNone;
  int64_t log_every = 10;        // progress / metrics cadence in steps (non-TTY progress lines)
  int64_t checkpoint_every = 0;  // 0: only at the end (and on Ctrl-C)
  int checkpoint_keep = 2;       // newest checkpoints kept in RUN_DIR/checkpoints
  // The parameters the run starts from instead of model.init_seed's: a safetensors file, an atoll
  // checkpoint or a run directory (src/store/model_io.h). Read by whoever initializes the global
  // model (the coordinator, `atoll train`); islands fetch it from the service.
  std::string init_from;
};

template <class V>
void VisitKeys(TrainConfig& c, V&& v) {
  v("steps", c.steps, "optimizer steps");
  v("batch_size", c.batch_size, "sequences per micro-batch");
  v("grad_accum", c.grad_accum, "micro-batches per optimizer step");
  v("eval_every", c.eval_every, "steps between evaluations (0: only at the end)");
  v("eval_batches", c.eval_batches, "fixed validation micro-batches");
  v("seed", c.seed, "seed of runtime randomness (dropout)");
  v("threads", c.threads, "intra-op CPU threads (0: all cores)");
  v("mixed_precision", c.mixed_precision,
    "\"none\" (fp32) or \"bf16\" (bf16 autocast; fp32 weights, gradients and AdamW)");
  v("device", c.device,
    "\"cpu\" (the default), \"auto\" (the rank's GPU if there is one), \"cuda\" (cuda:LOCAL_RANK) "
    "or \"cuda:N\"");
  v("log_every", c.log_every, "steps between progress lines");
  v("checkpoint_every", c.checkpoint_every, "steps between checkpoints (0: at end)");
  v("checkpoint_keep", c.checkpoint_keep, "newest checkpoints kept");
  v("init_from", c.init_from,
    "start from these parameters instead of model.init_seed's: a safetensors file (see atoll "
    "import), an atoll checkpoint or run directory");
}

absl::Status Validate(const TrainConfig& config);

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied to matrices (dim >= 2) only
};

absl::Status Validate(const AdamWOptions& options);

// The inner optimizer: "adamw" on every parameter, or "muon" on the blocks' 2-D matrices with
// AdamW on the embeddings, the head, norms and biases (inner/muon.h).
enum class InnerOptimizerName { kAdamW, kMuon };
absl::Status ParseConfigValue(const std::string& text, InnerOptimizerName* value);
std::string ConfigValueText(InnerOptimizerName value);

struct MuonOptions {
  double momentum = 0.95;  // mu of m = mu m + G
  bool nesterov = true;    // orthogonalize G + mu m rather than m
  int ns_steps = 5;        // Newton-Schulz iterations
};

struct OptimConfig {
  static constexpr const char* kSection = "optim";
  double lr = 1e-3;            // peak learning rate
  double min_lr_ratio = 0.1;   // cosine decays to lr * min_lr_ratio at train.steps
  int64_t warmup_steps = 100;  // linear warmup from lr / warmup_steps
  double grad_clip = 1.0;      // max global L2 norm; 0 disables clipping
  InnerOptimizerName name = InnerOptimizerName::kAdamW;
  AdamWOptions adamw;  // AdamW's, and Muon's for the parameters it leaves to AdamW
  MuonOptions muon;
};

template <class V>
void VisitKeys(OptimConfig& c, V&& v) {
  v("lr", c.lr, "peak learning rate");
  v("min_lr_ratio", c.min_lr_ratio, "final lr as a fraction of optim.lr");
  v("warmup_steps", c.warmup_steps, "linear warmup steps");
  v("grad_clip", c.grad_clip, "max global gradient norm (0: off)");
  v("beta1", c.adamw.beta1, "AdamW beta1");
  v("beta2", c.adamw.beta2, "AdamW beta2");
  v("eps", c.adamw.eps, "AdamW epsilon");
  v("weight_decay", c.adamw.weight_decay, "AdamW weight decay (matrices only; Muon's too)");
  v("name", c.name,
    "\"adamw\" or \"muon\" (the blocks' matrices by Muon with AdamW's learning rate, the rest "
    "by AdamW)");
  v("muon_momentum", c.muon.momentum, "Muon's momentum");
  v("muon_nesterov", c.muon.nesterov, "Muon orthogonalizes G + momentum m (else m)");
  v("muon_ns_steps", c.muon.ns_steps, "Muon's Newton-Schulz iterations");
}

// The warmup must fit the run's steps.
absl::Status Validate(const OptimConfig& config, const TrainConfig& train);

// "none" or "full": recompute each block's forward in backward.
enum class ActivationCheckpointMode { kNone, kFull };
absl::Status ParseConfigValue(const std::string& text, ActivationCheckpointMode* value);
std::string ConfigValueText(ActivationCheckpointMode value);

struct ActivationCheckpointConfig {
  static constexpr const char* kSection = "activation_checkpoint";
  ActivationCheckpointMode mode = ActivationCheckpointMode::kNone;
};

template <class V>
void VisitKeys(ActivationCheckpointConfig& c, V&& v) {
  v("mode", c.mode, "\"none\" or \"full\" (recompute each block's forward in backward)");
}

// The device a rank trains on, from train.device: "cpu", "cuda:N", "cuda" (the rank's own GPU,
// cuda:LOCAL_RANK) or "auto" (the rank's own GPU when there is one, else the CPU).
absl::StatusOr<std::string> ResolveDevice(const std::string& device, int local_rank,
                                          bool cuda_available);
// The same with CUDA as libtorch sees it.
absl::StatusOr<std::string> ResolveDevice(const std::string& device, int local_rank);

}  // namespace atl::inner

#endif  // ATOLL_INNER_TRAIN_CONFIG_H_
