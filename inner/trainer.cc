#include "inner/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"
#include "inner/parallel/communicator.h"
#include "inner/parallel/fsdp.h"
#include "inner/parallel/mesh.h"
#include "inner/parallel/pipeline.h"
#include "inner/torch_compat.h"

namespace atl::inner {
namespace {

constexpr char kModelPrefix[] = "model/";
constexpr char kOptimPrefix[] = "optim/";

}  // namespace

absl::StatusOr<std::string> ResolveDevice(const std::string& device, int local_rank) {
  return ResolveDevice(device, local_rank, device != "cpu" && torch::cuda::is_available());
}

double LearningRate(const OptimConfig& c, int64_t step, int64_t total_steps) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  const double min_lr = c.lr * c.min_lr_ratio;
  const double span = double(std::max<int64_t>(1, total_steps - c.warmup_steps));
  const double progress = std::min(1.0, double(step - c.warmup_steps) / span);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (c.lr - min_lr);
}

Trainer::Trainer(const TrainerConfig& config, std::shared_ptr<const Dataset> data,
                 BatchSampler sampler)
    : config_(config), data_(std::move(data)), sampler_(std::move(sampler)) {}

Trainer::~Trainer() = default;

namespace {

// How the trainer runs its model over the mesh, from its config sections.
parallel::FsdpOptions FsdpOptionsOf(const TrainerConfig& c) {
  parallel::FsdpOptions fsdp;
  fsdp.checkpoint_activations = c.activation_checkpoint.mode == ActivationCheckpointMode::kFull;
  fsdp.schedule = c.parallelism.pipeline_schedule;
  fsdp.sequence_parallel = c.parallelism.sequence_parallel;
  fsdp.bf16 = c.train.mixed_precision == MixedPrecision::kBf16;
  return fsdp;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerConfig& config,
                                                         std::shared_ptr<const Dataset> data,
                                                         int stream, int num_streams,
                                                         parallel::DeviceMesh* mesh) {
  const ModelConfig& model = config.model;
  const TrainConfig& train = config.train;
  ATL_RETURN_IF_ERROR(Validate(model));
  ATL_RETURN_IF_ERROR(Validate(train));
  ATL_RETURN_IF_ERROR(Validate(config.optim, train));
  ATL_RETURN_IF_ERROR(parallel::ValidateForModel(config.parallelism, model, train));
  if (data->train.context() != model.context) {
    return absl::InvalidArgumentError(absl::StrCat("data windows of ", data->train.context(),
                                                   " tokens do not match model.context ",
                                                   model.context));
  }
  ATL_ASSIGN_OR_RETURN(auto sampler,
                       BatchSampler::Create(&data->train, data->order_seed, stream, num_streams));

  if (train.threads > 0) torch::set_num_threads(train.threads);
  torch::manual_seed(train.seed);
  TrainerConfig resolved = config;
  if (train.device != "cpu") {  // this rank's device: LOCAL_RANK as torchrun sets it
    ATL_ASSIGN_OR_RETURN(auto rank, parallel::RankInfoFromEnvironment());
    ATL_ASSIGN_OR_RETURN(resolved.train.device, ResolveDevice(train.device, rank.local_rank));
  }

  std::unique_ptr<Trainer> t(new Trainer(resolved, data, std::move(sampler)));
  if (mesh == nullptr) {
    t->own_mesh_ = parallel::DeviceMesh::Single();
    mesh = t->own_mesh_.get();
  }
  t->mesh_ = mesh;
  ATL_ASSIGN_OR_RETURN(auto sharded, parallel::FsdpModel::Create(model, *mesh, resolved.train.device,
                                                              FsdpOptionsOf(config)));
  t->fsdp_ = std::move(sharded);
  t->fsdp_->module()->train();
  ATL_ASSIGN_OR_RETURN(t->optimizer_, NewInnerOptimizer(config.optim, model, *t->fsdp_));
  return t;
}

CausalLm& Trainer::model() { return fsdp_->module(); }

int64_t Trainer::tokens_per_step() const {
  return int64_t(train_.batch_size) * train_.grad_accum * model_config_.context *
         mesh_->shape().dp();
}

absl::Status Trainer::QueueStep() {
  const auto start = std::chrono::steady_clock::now();
  StepStats stats;
  stats.lr = LearningRate(optim_, step_ + schedule_shift_, train_.steps);
  if (ramp_done_ < ramp_steps_) {
    ++ramp_done_;
    stats.lr *= double(ramp_done_) / double(ramp_steps_);
  }
  optimizer_->ZeroGrad();
  const torch::Device device(train_.device);
  const int dp = mesh_->shape().dp(), b = train_.batch_size;
  // Each micro-batch's loss is the mean over its sequences; the gradients are averaged over the
  // micro-batches and the ranks.
  const int pieces = config_.parallelism.pipeline_microbatches, rows = b / pieces;
  const double grad_scale = 1.0 / (double(train_.grad_accum) * pieces * double(dp));
  std::vector<parallel::MicroBatch> micros;
  // The tokens go to a GPU from pinned memory, asynchronously (libtorch keeps each buffer until
  // its copy has run): a copy from pageable memory would wait for the device.
  const auto host = torch::TensorOptions().dtype(torch::kLong).pinned_memory(device.is_cuda());
  for (int micro = 0; micro < train_.grad_accum; ++micro) {
    auto inputs = torch::empty({b, model_config_.context}, host);
    auto targets = torch::empty({b, model_config_.context}, host);
    sampler_.NextSlice(b * dp, mesh_->dp_rank() * b, b, inputs.data_ptr<int64_t>(),
                       targets.data_ptr<int64_t>());
    inputs = inputs.to(device, /*non_blocking=*/true);
    targets = targets.to(device, /*non_blocking=*/true);
    for (int k = 0; k < pieces; ++k) {
      micros.push_back({inputs.narrow(0, k * rows, rows), targets.narrow(0, k * rows, rows)});
    }
  }
  ATL_ASSIGN_OR_RETURN(auto loss, fsdp_->ForwardBackward(micros, grad_scale));
  ATL_RETURN_IF_ERROR(fsdp_->ReduceGradients());
  // The global gradient norm over all shards, TP parts and stages, and the clipping of torch's
  // clip_grad_norm_ (coefficient clip / (norm + 1e-6) where below 1), all on the device: the
  // scalars the island reduces live on the parameters' device (NCCL groups take no others).
  at::Tensor norm = fsdp_->GradSquaredNorm();
  for (auto dim : {parallel::MeshDim::kDpShard, parallel::MeshDim::kTp, parallel::MeshDim::kPp}) {
    ATL_RETURN_IF_ERROR(mesh_->group(dim).AllReduceSum(norm));
  }
  norm.sqrt_();
  if (optim_.grad_clip > 0) {
    const at::Tensor coef = optim_.grad_clip / (norm + 1e-6);
    fsdp_->ScaleGrad(at::where(coef < 1, coef, at::ones_like(coef)));  // NaN: left as it is
  }
  ATL_RETURN_IF_ERROR(optimizer_->Step(stats.lr));
  at::Tensor losses = std::move(loss);
  ATL_RETURN_IF_ERROR(mesh_->dp().AllReduceSum(losses));
  step_ += 1;
  stats.step = step_;
  stats.tokens = tokens();
  stats.compute_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  pending_.push_back({stats, at::cat({losses.div_(double(dp)), norm})});
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StepStats>> Trainer::TakeStats() {
  std::vector<StepStats> out;
  if (pending_.empty()) return out;
  const auto start = std::chrono::steady_clock::now();
  std::vector<at::Tensor> values;
  for (const auto& p : pending_) values.push_back(p.values);
  at::Tensor host;
  try {
    host = at::cat(values).to(at::kCPU);  // waits for the device: the steps' work is done
  } catch (const std::exception& e) {
    pending_.clear();
    return absl::InternalError(absl::StrCat("training steps failed on the device: ", e.what()));
  }
  // The wait counts as the steps' compute time, in equal parts.
  const double wait_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      double(pending_.size());
  const double* v = host.data_ptr<double>();
  for (size_t i = 0; i < pending_.size(); ++i) {
    StepStats s = pending_[i].stats;
    s.loss = v[2 * i];
    s.grad_norm = v[2 * i + 1];
    s.compute_s += wait_s;
    out.push_back(s);
  }
  pending_.clear();
  return out;
}

absl::StatusOr<StepStats> Trainer::Step() {
  if (!pending_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Step with ", pending_.size(), " queued steps' stats not taken"));
  }
  ATL_RETURN_IF_ERROR(QueueStep());
  ATL_ASSIGN_OR_RETURN(auto stats, TakeStats());
  return stats.back();
}

absl::StatusOr<EvalStats> Trainer::Evaluate() {
  fsdp_->module()->eval();
  const torch::Device device(train_.device);
  const WindowSet& val = data_->val;
  const size_t total =
      std::min(val.size(), size_t(train_.eval_batches) * size_t(train_.batch_size));
  const int64_t t = model_config_.context;
  // Data-parallel ranks split the batches; every rank of the mesh takes part in every batch's
  // collectives (a rank without a batch of its own evaluates an empty share).
  const int dp = mesh_->shape().dp();
  const size_t batches = (total + size_t(train_.batch_size) - 1) / size_t(train_.batch_size);
  double weighted = 0, bytes = 0;
  for (size_t k = 0; k < batches; k += size_t(dp)) {
    const size_t mine = k + size_t(mesh_->dp_rank());
    const size_t begin = std::min(total, mine * size_t(train_.batch_size));
    const int64_t n = int64_t(std::min(total - begin, size_t(train_.batch_size)));
    // Ranks without a batch of their own repeat the first one and do not count it.
    const size_t from = n > 0 ? begin : 0;
    const int64_t rows = n > 0 ? n : std::min<int64_t>(int64_t(total), train_.batch_size);
    auto in = torch::empty({rows, t}, torch::kLong), tg = torch::empty({rows, t}, torch::kLong);
    for (int64_t i = 0; i < rows; ++i) {
      val.Fill(from + size_t(i), in.data_ptr<int64_t>() + i * t, tg.data_ptr<int64_t>() + i * t);
    }
    auto loss = fsdp_->Loss(in.to(device), tg.to(device));
    if (!loss.ok()) {
      fsdp_->module()->train();
      return loss.status();
    }
    if (n > 0) {
      weighted += *loss * double(n);
      // The targets just filled (the first n rows are this rank's own).
      bytes += TextBytes(tg.data_ptr<int64_t>(), size_t(n * t), data_->token_bytes);
    }
  }
  fsdp_->module()->train();
  auto sum = torch::tensor(std::vector<double>{weighted, bytes},
                           torch::TensorOptions().dtype(torch::kDouble)).to(device);
  ATL_RETURN_IF_ERROR(mesh_->dp().AllReduceSum(sum));
  const auto sums = sum.cpu();
  EvalStats out;
  out.loss = sums[0].item<double>() / double(total);
  out.bits = out.loss / std::log(2.0);
  out.per_byte = data_->per_byte;
  if (out.per_byte) {
    out.bits_per_byte = out.bits;
  } else if (!data_->token_bytes.empty() && sums[1].item<double>() > 0) {
    // Every target's loss in bits over the bytes of text the targets stand for.
    out.bits_per_byte = out.bits * double(total) * double(t) / sums[1].item<double>();
  }
  return out;
}

TrainerState Trainer::ExportState() const {
  TrainerState s;
  s.step = step_;
  s.adam_step = optimizer_->step();
  s.cursor = sampler_.cursor();
  const auto& shards = fsdp_->shards();
  // One copy of each element: replicas of the shards (dp_replicate > 0) and of the parameters
  // whole on every TP rank (TP rank > 0) write nothing.
  const bool replica_group = mesh_->coordinate(parallel::MeshDim::kDpReplicate) > 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& p = shards[i];
    if (replica_group || p.replica) continue;
    int64_t at = 0;
    for (const auto& [offset, count] : p.runs) {
      auto slice = [&](const std::string& name, const at::Tensor& v) {
        s.tensors.push_back(
            {name, v.detach().narrow(0, at, count).to(torch::kCPU, false, true), offset, p.shape});
      };
      slice(kModelPrefix + p.name, p.value);
      for (const auto& t : optimizer_->ShardState(i)) {
        slice(absl::StrCat(kOptimPrefix, t.name, "/", p.name), t.tensor);
      }
      at += count;
    }
  }
  s.rng_state = compat::GetDefaultCpuRngState();
  return s;
}

namespace {

// Copies elements [offset, offset + target.numel()) of the tensor `name` (flattened) from the
// slices that hold them; false when some element is not held, or a slice disagrees on the shape.
absl::Status Gather(const std::multimap<std::string, const TensorSlice*>& slices,
                    const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                    at::Tensor& target, std::vector<std::pair<at::Tensor, at::Tensor>>* copies) {
  const int64_t want_end = offset + target.numel();
  int64_t covered = 0;
  auto [lo, hi] = slices.equal_range(name);
  for (auto it = lo; it != hi; ++it) {
    const TensorSlice& s = *it->second;
    if (s.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(name, " has shape ", c10::str(s.shape),
                                                     ", expected ", c10::str(shape)));
    }
    if (s.values.scalar_type() != target.scalar_type() || s.values.dim() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": wrong dtype or layout"));
    }
    const int64_t a = std::max(offset, s.offset), b = std::min(want_end, s.offset + s.values.numel());
    if (a >= b) continue;
    copies->emplace_back(target.narrow(0, a - offset, b - a), s.values.narrow(0, a - s.offset, b - a));
    covered += b - a;
  }
  if (covered != target.numel()) {
    return absl::NotFoundError(absl::StrCat("the state does not hold elements [", offset, ", ",
                                            want_end, ") of ", name, " (it holds ", covered, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Trainer::ImportState(const TrainerState& state) {
  if (state.step < 0) return absl::InvalidArgumentError(absl::StrCat("negative step ", state.step));
  if (state.adam_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative AdamW step ", state.adam_step));
  }
  std::multimap<std::string, const TensorSlice*> slices;
  std::set<std::string> names;
  for (const auto& t : state.tensors) {
    slices.emplace(t.name, &t);
    if (t.name.rfind(kModelPrefix, 0) == 0) names.insert(t.name);
  }
  const auto& shards = fsdp_->shards();
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (destination, source): all checked first
  std::set<std::string> model_names;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& p = shards[i];
    model_names.insert(kModelPrefix + p.name);
    // The parameter, then the optimizer's state of it (names with a kind: another optimizer's
    // checkpoint is missing this one's kinds, and refused).
    std::vector<NamedTensor> targets = {{kModelPrefix + p.name, p.value}};
    for (const auto& t : optimizer_->ShardState(i)) {
      targets.push_back({absl::StrCat(kOptimPrefix, t.name, "/", p.name), t.tensor});
    }
    for (auto& [name, target] : targets) {
      int64_t at = 0;
      for (const auto& [offset, count] : p.runs) {
        at::Tensor part = target.narrow(0, at, count);
        ATL_RETURN_IF_ERROR(Gather(slices, name, p.shape, offset, part, &copies));
        at += count;
      }
    }
  }
  // Every parameter of the model, not only this rank's, must be in a state it accepts.
  for (const auto& name : fsdp_->module()->named_parameters().keys()) {
    if (!names.count(kModelPrefix + name)) {
      return absl::NotFoundError(absl::StrCat("missing parameter ", name));
    }
  }
  if (names.size() != size_t(fsdp_->module()->named_parameters().size())) {
    return absl::InvalidArgumentError(absl::StrCat("state holds ", names.size(),
                                                   " parameters, the model has ",
                                                   fsdp_->module()->named_parameters().size()));
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
  // Checked: nothing below can fail.
  torch::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(src);
  optimizer_->SetStep(state.adam_step);
  sampler_.set_cursor(state.cursor);
  if (state.rng_state.defined()) compat::SetDefaultCpuRngState(state.rng_state);
  step_ = state.step;
  return absl::OkStatus();
}

}  // namespace atl::inner
