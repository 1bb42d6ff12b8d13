#include "inner/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "inner/torch_compat.h"

namespace atl::inner {
namespace {

constexpr char kModelPrefix[] = "model/";
constexpr char kOptimPrefix[] = "optim/";

}  // namespace

absl::Status Validate(const TrainConfig& c) {
  if (c.steps <= 0) return absl::InvalidArgumentError(absl::StrCat("train.steps must be positive, got ", c.steps));
  if (c.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.batch_size must be positive, got ", c.batch_size));
  }
  if (c.grad_accum <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.grad_accum must be positive, got ", c.grad_accum));
  }
  if (c.eval_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.eval_every must be >= 0, got ", c.eval_every));
  }
  if (c.eval_batches <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.eval_batches must be positive, got ", c.eval_batches));
  }
  if (c.threads < 0) return absl::InvalidArgumentError(absl::StrCat("train.threads must be >= 0, got ", c.threads));
  if (c.device != "cpu" && c.device.rfind("cuda", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.device must be \"cpu\" or \"cuda[:N]\", got \"", c.device, "\""));
  }
  if (c.device != "cpu" && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        absl::StrCat("train.device = \"", c.device, "\" but no CUDA device is available"));
  }
  return absl::OkStatus();
}

absl::Status Validate(const OptimConfig& c, const TrainConfig& train) {
  if (!(c.lr > 0) || !std::isfinite(c.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.lr must be positive, got ", c.lr));
  }
  if (!(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optim.min_lr_ratio must be in [0, 1], got ", c.min_lr_ratio));
  }
  if (c.warmup_steps < 0 || c.warmup_steps > train.steps) {
    return absl::InvalidArgumentError(absl::StrCat("optim.warmup_steps must be in [0, train.steps = ",
                                                   train.steps, "], got ", c.warmup_steps));
  }
  if (!(c.grad_clip >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.grad_clip must be >= 0, got ", c.grad_clip));
  }
  return Validate(c.adamw);
}

double LearningRate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  const double min_lr = c.lr * c.min_lr_ratio;
  const double span = double(std::max<int64_t>(1, total_steps - c.warmup_steps));
  const double progress = std::min(1.0, double(step - c.warmup_steps) / span);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (c.lr - min_lr);
}

Trainer::Trainer(const ModelConfig& model, const OptimConfig& optim, const TrainConfig& train,
                 std::shared_ptr<const Dataset> data, BatchSampler sampler)
    : model_config_(model),
      optim_(optim),
      train_(train),
      data_(std::move(data)),
      sampler_(std::move(sampler)) {}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& model,
                                                         const OptimConfig& optim,
                                                         const TrainConfig& train,
                                                         std::shared_ptr<const Dataset> data,
                                                         int stream, int num_streams) {
  if (auto s = Validate(model); !s.ok()) return s;
  if (auto s = Validate(train); !s.ok()) return s;
  if (auto s = Validate(optim, train); !s.ok()) return s;
  if (data->train.context() != model.context) {
    return absl::InvalidArgumentError(absl::StrCat("data windows of ", data->train.context(),
                                                   " tokens do not match model.context ",
                                                   model.context));
  }
  auto sampler = BatchSampler::Create(&data->train, data->order_seed, stream, num_streams);
  if (!sampler.ok()) return sampler.status();

  if (train.threads > 0) torch::set_num_threads(train.threads);
  torch::manual_seed(train.seed);

  std::unique_ptr<Trainer> t(new Trainer(model, optim, train, data, *std::move(sampler)));
  t->model_ = Gpt(model);
  t->model_->to(torch::Device(train.device));
  t->model_->train();
  t->params_ = NamedParameters(*t->model_);
  t->adamw_ = std::make_unique<AdamW>(t->params_, optim.adamw);
  t->inputs_ = torch::empty({train.batch_size, model.context}, torch::kLong);
  t->targets_ = torch::empty({train.batch_size, model.context}, torch::kLong);
  return t;
}

int64_t Trainer::tokens_per_step() const {
  return int64_t(train_.batch_size) * train_.grad_accum * model_config_.context;
}

StepStats Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  StepStats stats;
  stats.lr = LearningRate(optim_, step_ + schedule_shift_, train_.steps);
  if (ramp_done_ < ramp_steps_) {
    ++ramp_done_;
    stats.lr *= double(ramp_done_) / double(ramp_steps_);
  }
  adamw_->ZeroGrad();
  const torch::Device device(train_.device);
  double loss_sum = 0;
  for (int micro = 0; micro < train_.grad_accum; ++micro) {
    sampler_.Next(train_.batch_size, inputs_.data_ptr<int64_t>(), targets_.data_ptr<int64_t>());
    auto loss = model_->Loss(inputs_.to(device), targets_.to(device));
    if (train_.grad_accum > 1) loss = loss / double(train_.grad_accum);
    loss.backward();
    loss_sum += loss.item<double>();
  }
  std::vector<torch::Tensor> params;
  params.reserve(params_.size());
  for (auto& [name, p] : params_) params.push_back(p);
  const double max_norm =
      optim_.grad_clip > 0 ? optim_.grad_clip : std::numeric_limits<double>::infinity();
  stats.grad_norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
  adamw_->Step(stats.lr);
  step_ += 1;
  stats.step = step_;
  stats.loss = loss_sum;
  stats.tokens = tokens();
  stats.compute_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

EvalStats Trainer::Evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  const torch::Device device(train_.device);
  const WindowSet& val = data_->val;
  const size_t total =
      std::min(val.size(), size_t(train_.eval_batches) * size_t(train_.batch_size));
  const int64_t t = model_config_.context;
  double weighted = 0;
  for (size_t begin = 0; begin < total; begin += size_t(train_.batch_size)) {
    const int64_t n = int64_t(std::min(total - begin, size_t(train_.batch_size)));
    auto in = torch::empty({n, t}, torch::kLong), tg = torch::empty({n, t}, torch::kLong);
    for (int64_t i = 0; i < n; ++i) {
      val.Fill(begin + size_t(i), in.data_ptr<int64_t>() + i * t, tg.data_ptr<int64_t>() + i * t);
    }
    weighted += model_->Loss(in.to(device), tg.to(device)).item<double>() * double(n);
  }
  model_->train();
  EvalStats out;
  out.loss = weighted / double(total);
  out.bits = out.loss / std::log(2.0);
  out.per_byte = data_->per_byte;
  return out;
}

TrainerState Trainer::ExportState() const {
  TrainerState s;
  s.step = step_;
  s.adam_step = adamw_->step();
  s.cursor = sampler_.cursor();
  for (const auto& [name, p] : params_) {
    s.tensors.push_back({kModelPrefix + name, p.detach().to(torch::kCPU, /*non_blocking=*/false,
                                                            /*copy=*/true)});
  }
  for (auto& t : adamw_->State()) {
    s.tensors.push_back({kOptimPrefix + t.name, t.tensor.to(torch::kCPU, false, true)});
  }
  s.rng_state = compat::GetDefaultCpuRngState();
  return s;
}

absl::Status Trainer::ImportState(const TrainerState& state) {
  if (state.step < 0) return absl::InvalidArgumentError(absl::StrCat("negative step ", state.step));
  std::unordered_map<std::string, const torch::Tensor*> by_name;
  std::vector<NamedTensor> optim;
  for (const auto& t : state.tensors) {
    if (t.name.rfind(kOptimPrefix, 0) == 0) {
      optim.push_back({t.name.substr(sizeof(kOptimPrefix) - 1), t.tensor});
    } else {
      by_name[t.name] = &t.tensor;
    }
  }
  for (const auto& [name, p] : params_) {
    auto it = by_name.find(kModelPrefix + name);
    if (it == by_name.end()) return absl::NotFoundError(absl::StrCat("missing parameter ", name));
    if (it->second->sizes() != p.sizes() || it->second->dtype() != p.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " has shape ",
                                                     c10::str(it->second->sizes()), ", expected ",
                                                     c10::str(p.sizes())));
    }
  }
  if (by_name.size() != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state holds ", by_name.size(),
                                                   " parameters, the model has ", params_.size()));
  }
  if (state.cursor.index > sampler_.windows_per_epoch()) {
    return absl::InvalidArgumentError(absl::StrCat("data cursor ", state.cursor.index,
                                                   " is past the epoch's ",
                                                   sampler_.windows_per_epoch(), " windows"));
  }
  if (state.rng_state.defined()) {
    const auto current = compat::GetDefaultCpuRngState();
    if (state.rng_state.sizes() != current.sizes() || state.rng_state.dtype() != current.dtype()) {
      return absl::InvalidArgumentError("RNG state does not fit this build's CPU generator");
    }
  }
  // AdamW validates everything before it copies; after it succeeds nothing below can fail.
  if (auto s = adamw_->LoadState(state.adam_step, optim); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : params_) p.copy_(*by_name.at(kModelPrefix + name));
  sampler_.set_cursor(state.cursor);
  if (state.rng_state.defined()) compat::SetDefaultCpuRngState(state.rng_state);
  step_ = state.step;
  return absl::OkStatus();
}

absl::Status RunLoop(Trainer& trainer, int64_t until_step, LoopObserver& observer,
                     bool evaluate) {
  const auto& cfg = trainer.train_config();
  while (trainer.step() < until_step) {
    const StepStats stats = trainer.Step();
    std::optional<EvalStats> eval;
    if (evaluate &&
        ((cfg.eval_every > 0 && stats.step % cfg.eval_every == 0) || stats.step == cfg.steps)) {
      eval = trainer.Evaluate();
    }
    if (auto s = observer.OnStep(stats, eval ? &*eval : nullptr); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace atl::inner
