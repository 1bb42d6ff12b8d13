#include "inner/parallel/fsdp.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/torch_compat.h"

namespace atl::inner::parallel {

struct FsdpModel::Unit {
  std::string name;
  std::vector<std::pair<std::string, at::Tensor>> params;  // the module's, in model order
  std::vector<int64_t> offsets;                            // of each within the unit's flat
  int64_t numel = 0, padded = 0, shard_numel = 0;
  int64_t partial_numel = 0;  // the leading parameters that are sequence-partial (their plan)
  at::Tensor shard, shard_grad;  // this rank's part (the whole unit with one rank)
  at::Tensor full, full_grad;    // the whole unit; storage empty while not in use (sharded)
  at::Tensor scatter;            // sharded: the reduce-scattered gradient of one micro-batch
  // Sharded bf16: the module computes with the gathered parameters in bf16 (full and full_grad
  // are bf16), the all-gather sends the shard rounded to bf16 (this buffer), the gradient is
  // reduce-scattered in fp32; shard, shard_grad and AdamW stay fp32.
  at::Tensor shard_low;
  std::unique_ptr<Work> pending;  // an all-gather in flight
  bool gathered = false;
  bool grad_live = false;  // full_grad holds storage (sharded)
  bool is_block = false;
  int index = 0;  // the model's unit
};

// A micro-batch in flight through this rank's stage: what its backward needs.
struct FsdpModel::Micro {
  at::Tensor inputs, targets;
  std::vector<at::Tensor> unit_inputs, unit_outputs;  // per unit of the stage
  std::vector<at::Tensor> rng;  // checkpointed blocks: the CPU generator before their forward
  at::Tensor loss;              // last stage: the micro-batch's mean loss, on the device
};

// This rank's stage for one run of the pipeline (inner/parallel/pipeline.h).
class FsdpModel::StageRun : public PipelineStage {
 public:
  StageRun(FsdpModel& model, const std::vector<MicroBatch>& batches, bool train, double grad_scale)
      : model_(model), train_(train), grad_scale_(grad_scale), micros_(batches.size()) {
    for (size_t i = 0; i < batches.size(); ++i) {
      micros_[i].inputs = batches[i].inputs;
      micros_[i].targets = batches[i].targets;
    }
  }
  absl::StatusOr<at::Tensor> Forward(int micro, const at::Tensor& input) override {
    return model_.ForwardMicro(micros_[size_t(micro)], input, train_);
  }
  absl::StatusOr<at::Tensor> Backward(int micro, const at::Tensor& grad) override {
    return model_.BackwardMicro(micros_[size_t(micro)], grad, grad_scale_);
  }
  at::Tensor Boundary(int micro) override {
    const at::Tensor& tokens = micros_[size_t(micro)].inputs;
    // Between blocks: the rank's slice of the sequence under sequence parallelism.
    const int64_t slices = model_.tp_ != nullptr && model_.tp_->sequence_parallel()
                               ? model_.tp_->size() : 1;
    return at::empty({tokens.size(0), tokens.size(1) / slices, model_.model_->hidden_size()},
                     model_.units_.front()->shard.options());
  }
  // The mean of the micro-batches' losses, on the device (added in double in micro-batch order):
  // the step never waits for a forward to finish before queuing the next work.
  at::Tensor mean_loss() const {
    at::Tensor sum = at::zeros({1}, model_.units_.front()->shard.options().dtype(at::kDouble));
    for (const auto& m : micros_) {
      if (m.loss.defined()) sum.add_(m.loss.detach().to(at::kDouble).reshape({1}));
    }
    return sum.div_(double(micros_.size()));
  }

 private:
  FsdpModel& model_;
  const bool train_;
  const double grad_scale_;
  std::vector<Micro> micros_;
};

namespace {

// Ranges (offset, count) of a parameter's canonical flat order for elements [a, b) of the part a
// rank holds, given that part's ranges (TpRanges).
std::vector<std::pair<int64_t, int64_t>> Runs(const std::vector<std::pair<int64_t, int64_t>>& part,
                                              int64_t a, int64_t b) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;  // where each range of the part starts within the part
  for (const auto& [offset, count] : part) {
    const int64_t lo = std::max(a, at), hi = std::min(b, at + count);
    if (lo < hi) out.emplace_back(offset + (lo - at), hi - lo);
    at += count;
  }
  return out;
}

}  // namespace

FsdpModel::FsdpModel(const ModelConfig& config, DeviceMesh& mesh, FsdpOptions options)
    : mesh_(mesh),
      tp_(mesh.shape().tp > 1 ? std::make_shared<TpGroup>(mesh.group(MeshDim::kTp),
                                                           options.sequence_parallel)
                              : nullptr),
      model_(BuildModel(config)),
      plan_(PlanOf(config)),
      options_(options),
      stage_(PipelineStageUnits(config.n_layer, mesh.shape().pp,
                                mesh.coordinate(MeshDim::kPp))) {}

FsdpModel::~FsdpModel() {
  for (auto& u : units_) {
    if (u->pending) u->pending->Wait().IgnoreError();
  }
}

bool FsdpModel::sharded() const { return mesh_.shape().dp_shard > 1; }

absl::StatusOr<std::unique_ptr<FsdpModel>> FsdpModel::Create(const ModelConfig& config,
                                                         DeviceMesh& mesh,
                                                         const std::string& device,
                                                         FsdpOptions options) {
  ATL_RETURN_IF_ERROR(Validate(config));
  ATL_RETURN_IF_ERROR(ValidatePipeline(config.n_layer, mesh.shape().pp));
  ATL_RETURN_IF_ERROR(ValidateTensorParallel(config, mesh.shape().tp, options.sequence_parallel));
  ATL_RETURN_IF_ERROR(ValidateTiedEmbeddings(config, mesh.shape().dp_shard, mesh.shape().pp));
  // Initialized from config.init_seed on the CPU: every rank's part of the same model.
  std::unique_ptr<FsdpModel> f(new FsdpModel(config, mesh, options));
  if (f->tp_ != nullptr) ApplyTensorParallel(*f->model_, f->plan_, f->tp_);
  if (device != "cpu") f->model_->to(torch::Device(device));  // "cuda:N", resolved
  f->on_cuda_ = device != "cpu";
  ATL_RETURN_IF_ERROR(f->BuildUnits());
  return f;
}

// The stage's units, each with its parameters: those whole on every TP rank first, then the
// TP-split ones, at their offsets in the unit's flat buffer. The other stages' parameters are
// freed.
void FsdpModel::AssignParameters() {
  const int n_layer = model_->config().n_layer;
  units_.clear();
  for (int u = stage_.first; u <= stage_.last; ++u) {
    units_.push_back(std::make_unique<Unit>());
    Unit& unit = *units_.back();
    unit.name = u == 0 ? "embed" : (u <= n_layer ? absl::StrCat("blocks.", u - 1) : "head");
    unit.is_block = u >= 1 && u <= n_layer;
    unit.index = u;
  }
  // Each unit's parameters: those whole on every TP rank first, then the TP-split ones. The other
  // stages' parameters are freed.
  for (auto& [name, p] : NamedParameters(*model_)) {
    const int u = UnitOf(plan_, name, n_layer);
    if (u < stage_.first || u > stage_.last) {
      p.set_data(at::empty({0}, p.options()));
      continue;
    }
    units_[size_t(u - stage_.first)]->params.emplace_back(name, p);
  }
  for (auto& u : units_) {
    std::stable_partition(u->params.begin(), u->params.end(),
                          [&](const auto& named) {
                            return PlanOf(plan_, named.first).style == TpStyle::kReplicated;
                          });
    for (const auto& [name, p] : u->params) {
      u->offsets.push_back(u->numel);
      u->numel += p.numel();
      if (PlanOf(plan_, name).sequence_partial && u->partial_numel + p.numel() == u->numel) {
        u->partial_numel = u->numel;
      }
    }
  }
}

// Unit ui's flat buffers (this rank's shard of them, when sharded), the module's parameters and
// gradients made views of them, and the parts of each parameter in this rank's shard.
void FsdpModel::FlattenUnit(size_t ui,
                            const std::map<std::string, std::vector<int64_t>>& whole_shape) {
  const int64_t ranks = mesh_.shape().dp_shard;
  const int64_t me = mesh_.coordinate(MeshDim::kDpShard);
  const int tp_rank = mesh_.coordinate(MeshDim::kTp), tp_size = mesh_.shape().tp;
  Unit& u = *units_[ui];
  u.padded = (u.numel + ranks - 1) / ranks * ranks;
  u.shard_numel = u.padded / ranks;
  const auto options = u.params.front().second.options();
  at::Tensor flat = at::zeros({u.padded}, options);
  for (size_t i = 0; i < u.params.size(); ++i) {
    const auto& [name, p] = u.params[i];
    flat.narrow(0, u.offsets[i], p.numel()).copy_(CanonicalFlat(PlanOf(plan_, name), p));
  }
  if (sharded()) {
    const auto gathered = options_.bf16 ? options.dtype(at::kBFloat16) : options;
    u.shard = flat.narrow(0, me * u.shard_numel, u.shard_numel).clone();
    u.shard_grad = at::zeros({u.shard_numel}, options);
    u.scatter = at::empty({u.shard_numel}, options);
    u.full = at::empty({u.padded}, gathered);
    u.full_grad = at::empty({u.padded}, gathered);
    if (options_.bf16) u.shard_low = at::empty({u.shard_numel}, gathered);
  } else {
    u.full = u.shard = flat;
    u.full_grad = u.shard_grad = at::zeros({u.padded}, options);
    u.gathered = true;
  }
  // The module's parameters (and their gradients) become views of the unit's flat buffers.
  for (size_t i = 0; i < u.params.size(); ++i) {
    auto& [name, p] = u.params[i];
    const auto shape = p.sizes().vec();
    const ParamPlan pp = PlanOf(plan_, name);
    p.set_data(ShapedView(pp, u.full.narrow(0, u.offsets[i], p.numel()), shape));
    p.mutable_grad() = ShapedView(pp, u.full_grad.narrow(0, u.offsets[i], p.numel()), shape);
    // The part of this parameter inside this rank's shard.
    const int64_t lo = std::max(u.offsets[i], me * u.shard_numel);
    const int64_t hi = std::min(u.offsets[i] + p.numel(), (me + 1) * u.shard_numel);
    if (lo >= hi) continue;
    ParamShard s;
    s.name = name;
    s.shape = whole_shape.at(name);
    s.runs = Runs(TpRanges(pp, s.shape, tp_rank, tp_size), lo - u.offsets[i],
                  hi - u.offsets[i]);
    s.value = u.shard.narrow(0, lo - me * u.shard_numel, hi - lo);
    s.grad = u.shard_grad.narrow(0, lo - me * u.shard_numel, hi - lo);
    s.decay = shape.size() >= 2;
    s.replica = tp_rank > 0 && pp.style == TpStyle::kReplicated;
    s.unit = int(ui);
    shards_.push_back(std::move(s));
  }
  if (sharded()) {  // gathered only when needed, from now on
    compat::ResizeStorage(u.full, 0);
    compat::ResizeStorage(u.full_grad, 0);
  }
}

absl::Status FsdpModel::BuildUnits() {
  torch::NoGradGuard no_grad;
  AssignParameters();
  std::map<std::string, std::vector<int64_t>> whole_shape;
  for (auto& [name, shape] : ParameterShapes(model_->config())) whole_shape[name] = shape;
  for (size_t ui = 0; ui < units_.size(); ++ui) FlattenUnit(ui, whole_shape);
  return absl::OkStatus();
}

std::vector<std::string> FsdpModel::unit_parameters(int u) const {
  std::vector<std::string> names;
  for (const auto& [name, p] : units_[size_t(u)]->params) names.push_back(name);
  return names;
}

FsdpMemory FsdpModel::memory() const {
  FsdpMemory m;
  for (const auto& u : units_) m.shard_bytes += 2 * u->shard_numel * int64_t(sizeof(float));
  m.gathered_element_bytes = units_.empty() ? 4 : int(units_.front()->full.element_size());
  m.peak_gathered_bytes = peak_live_bytes_;
  return m;
}

void FsdpModel::Prefetch(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded() || unit.gathered || unit.pending) return;
  const int64_t bytes = unit.padded * int64_t(unit.full.element_size());
  compat::ResizeStorage(unit.full, size_t(bytes));
  live_bytes_ += bytes;
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  if (!unit.shard_low.defined()) {
    unit.pending = mesh_.group(MeshDim::kDpShard).AllGatherAsync(unit.shard, unit.full);
    return;
  }
  torch::NoGradGuard no_grad;
  unit.shard_low.copy_(unit.shard);  // rounded to the nearest bf16
  unit.pending = mesh_.group(MeshDim::kDpShard).AllGatherAsync(unit.shard_low, unit.full);
}

absl::Status FsdpModel::Gather(int u) {
  Unit& unit = *units_[size_t(u)];
  if (unit.gathered) return absl::OkStatus();
  Prefetch(u);
  auto s = unit.pending->Wait();
  unit.pending.reset();
  unit.gathered = s.ok();
  return s;
}

void FsdpModel::Release(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded() || !unit.gathered) return;
  compat::ResizeStorage(unit.full, 0);
  live_bytes_ -= unit.padded * int64_t(unit.full.element_size());
  unit.gathered = false;
}

void FsdpModel::PrepareGrad(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded() || unit.grad_live) return;  // a held unit's gradient accumulates
  const int64_t bytes = unit.padded * int64_t(unit.full_grad.element_size());
  compat::ResizeStorage(unit.full_grad, size_t(bytes));
  live_bytes_ += bytes;
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  unit.full_grad.zero_();
  unit.grad_live = true;
}

absl::Status FsdpModel::ScatterGrad(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded() || !unit.grad_live) return absl::OkStatus();
  // bf16 gradients are summed over the ranks in fp32 (by the communicator).
  const absl::Status s =
      mesh_.group(MeshDim::kDpShard).ReduceScatterSum(unit.full_grad, unit.scatter);
  compat::ResizeStorage(unit.full_grad, 0);
  live_bytes_ -= unit.padded * int64_t(unit.full_grad.element_size());
  unit.grad_live = false;
  if (!s.ok()) return s;
  unit.shard_grad.add_(unit.scatter);
  return absl::OkStatus();
}

absl::Status FsdpModel::FinishHeldUnits(absl::Status status) {
  for (int u = num_units() - 1; u >= 0; --u) {
    if (status.ok()) status = ScatterGrad(u);  // after a failure, no collective more
    Release(u);
  }
  return status;
}

at::Tensor FsdpModel::RunUnit(int u, const at::Tensor& x) {
  const int n_layer = model_->config().n_layer;
  const int unit = units_[size_t(u)]->index;
  if (unit == 0) return model_->Embed(x);
  // Activations in the unit's precision: a stage's input comes in fp32 (bf16 FSDP computes in
  // bf16); the cast is in the graph, so the input's gradient goes back in fp32.
  const auto dtype = units_[size_t(u)]->full.scalar_type();
  const at::Tensor in = x.scalar_type() == dtype ? x : x.to(dtype);
  if (unit <= n_layer) return model_->RunBlock(unit - 1, in);
  return model_->Logits(in);
}

// A micro-batch's forward through the stage's units. Training: each unit's input is a leaf (its
// gradient is what the unit below, or the stage before, receives in backward) and its output keeps
// the unit's graph, except for checkpointed blocks, which run without a graph and are recomputed in
// backward.
absl::StatusOr<at::Tensor> FsdpModel::ForwardMicro(Micro& m, const at::Tensor& input, bool train) {
  const int n = num_units();
  at::Tensor x = first_stage() ? m.inputs : input;
  if (train) {
    m.unit_inputs.assign(size_t(n), at::Tensor());
    m.unit_outputs.assign(size_t(n), at::Tensor());
    m.rng.assign(size_t(n), at::Tensor());
  }
  for (int u = 0; u < n; ++u) {
    ATL_RETURN_IF_ERROR(Gather(u));
    if (options_.prefetch && u + 1 < n) Prefetch(u + 1);
    if (train && (u > 0 || !first_stage())) x = x.detach().requires_grad_(true);
    if (train) m.unit_inputs[size_t(u)] = x;
    const bool recompute = train && options_.checkpoint_activations && units_[size_t(u)]->is_block;
    at::Tensor out;
    if (!train || recompute) {
      // The same dropout draws in the recomputation: the generator as it is now. (CPU's; a CUDA
      // build with dropout would need the device generator too.)
      if (recompute) m.rng[size_t(u)] = compat::GetDefaultCpuRngState();
      torch::NoGradGuard no_grad;
      out = RunUnit(u, x);
    } else {
      out = RunUnit(u, x);
    }
    if (u == n - 1 && last_stage()) {
      out = torch::nn::functional::cross_entropy(out.view({-1, out.size(-1)}),
                                                 m.targets.reshape({-1}));
      m.loss = out.detach();
    }
    // Stages exchange fp32 (the receive buffers' type): bf16 FSDP's bf16 activations are cast in
    // the graph, so their gradient comes back to them in bf16.
    if (u == n - 1 && !last_stage()) out = out.to(at::kFloat);
    if (train) m.unit_outputs[size_t(u)] = out;
    // The last unit's backward may come next: it stays gathered.
    if (!holding_ && (u < n - 1 || !train)) Release(u);
    x = out;
  }
  return x;
}

absl::StatusOr<at::Tensor> FsdpModel::BackwardMicro(Micro& m, const at::Tensor& grad_output,
                                                  double grad_scale) {
  const int n = num_units();
  at::Tensor grad = last_stage()
                        ? at::full({}, grad_scale, m.unit_outputs[size_t(n - 1)].options())
                        : grad_output;
  for (int u = n - 1; u >= 0; --u) {
    ATL_RETURN_IF_ERROR(Gather(u));
    PrepareGrad(u);
    at::Tensor out = m.unit_outputs[size_t(u)];
    if (m.rng[size_t(u)].defined()) {
      const at::Tensor now = compat::GetDefaultCpuRngState();
      compat::SetDefaultCpuRngState(m.rng[size_t(u)]);
      out = RunUnit(u, m.unit_inputs[size_t(u)]);
      compat::SetDefaultCpuRngState(now);
    }
    torch::autograd::backward({out}, {grad});
    m.unit_outputs[size_t(u)] = at::Tensor();
    grad = u > 0 || !first_stage() ? m.unit_inputs[size_t(u)].grad() : at::Tensor();
    m.unit_inputs[size_t(u)] = at::Tensor();
    if (holding_) continue;
    // Two units at most are whole at once: u's parameters go before the unit below is gathered
    // (in the background, while u's gradients are reduce-scattered).
    Release(u);
    if (options_.prefetch && u > 0) Prefetch(u - 1);
    ATL_RETURN_IF_ERROR(ScatterGrad(u));
  }
  return grad;
}

// A collective of tensor parallelism that fails inside autograd throws: its error, as a status.
template <typename T>
absl::StatusOr<T> FsdpModel::Guarded(const std::function<absl::StatusOr<T>()>& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    holding_ = false;  // the island cannot go on: its next step starts afresh
    if (tp_ != nullptr && !tp_->status().ok()) return tp_->status();
    return absl::InternalError(absl::StrCat("training step failed: ", e.what()));
  }
}

absl::StatusOr<at::Tensor> FsdpModel::RunStage(const std::vector<MicroBatch>& micros,
                                             const std::vector<PipelineAction>& actions,
                                             bool train, double grad_scale) {
  StageRun run(*this, micros, train, grad_scale);
  const compat::AutocastBf16 autocast(options_.bf16, on_cuda_);
  holding_ = train && mesh_.shape().pp > 1;
  auto timing = RunPipeline(mesh_.group(MeshDim::kPp), actions, run);
  absl::Status status = timing.status();
  if (holding_) status = FinishHeldUnits(status);
  holding_ = false;
  if (!status.ok()) return status;
  if (train) timing_ = *timing;
  if (mesh_.shape().pp == 1) return run.mean_loss();
  // The last stage's loss, on every stage.
  at::Tensor loss = run.mean_loss();
  if (!last_stage()) loss.zero_();
  ATL_RETURN_IF_ERROR(mesh_.group(MeshDim::kPp).AllReduceSum(loss));
  return loss;
}

absl::StatusOr<at::Tensor> FsdpModel::ForwardBackward(const std::vector<MicroBatch>& micros,
                                                    double grad_scale) {
  const auto actions = ScheduleActions(options_.schedule, mesh_.coordinate(MeshDim::kPp),
                                       mesh_.shape().pp, int(micros.size()));
  return Guarded<at::Tensor>(
      [&] { return RunStage(micros, actions, /*train=*/true, grad_scale); });
}

absl::Status FsdpModel::ReduceGradients() {
  if (tp_ != nullptr && tp_->sequence_parallel()) {
    // The partial parameters lead each unit, so their shards sit at the same place on every TP
    // rank: one all-reduce of all of them.
    const int64_t me = mesh_.coordinate(MeshDim::kDpShard);
    std::vector<at::Tensor> partial;
    for (auto& u : units_) {
      const int64_t count =
          std::clamp<int64_t>(u->partial_numel - me * u->shard_numel, 0, u->shard_numel);
      if (count > 0) partial.push_back(u->shard_grad.narrow(0, 0, count));
    }
    if (!partial.empty()) {
      at::Tensor sums = at::cat(partial);
      ATL_RETURN_IF_ERROR(mesh_.group(MeshDim::kTp).AllReduceSum(sums));
      int64_t at = 0;
      for (auto& g : partial) {
        g.copy_(sums.narrow(0, at, g.numel()));
        at += g.numel();
      }
    }
  }
  if (mesh_.shape().dp_replicate == 1) return absl::OkStatus();
  for (auto& u : units_) {
    ATL_RETURN_IF_ERROR(mesh_.group(MeshDim::kDpReplicate).AllReduceSum(u->shard_grad));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> FsdpModel::Loss(const at::Tensor& inputs, const at::Tensor& targets) {
  return Guarded<double>([&]() -> absl::StatusOr<double> {
    torch::NoGradGuard no_grad;
    ATL_ASSIGN_OR_RETURN(auto loss,
                         RunStage({{inputs, targets}}, ForwardActions(1), /*train=*/false, 0.0));
    return loss.item<double>();
  });
}

void FsdpModel::ZeroGrad() {
  for (auto& u : units_) u->shard_grad.zero_();
}

at::Tensor FsdpModel::GradSquaredNorm() const {
  // The shards' norms, squared and added in double, on the device.
  std::vector<at::Tensor> norms;
  for (const auto& s : shards_) {
    if (!s.replica) norms.push_back(s.grad.norm().reshape({1}));
  }
  const auto options = units_.front()->shard_grad.options().dtype(at::kDouble);
  if (norms.empty()) return at::zeros({1}, options);
  const at::Tensor n = at::cat(norms).to(at::kDouble);
  return n.mul(n).sum().reshape({1});
}

absl::Status FsdpModel::BroadcastShards(MeshDim dim, const std::vector<size_t>& shards) {
  if (mesh_.shape().degree(dim) == 1 || shards.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> values;
  for (size_t i : shards) values.push_back(shards_[i].value);
  at::Tensor all = at::cat(values);  // one broadcast for all of them
  ATL_RETURN_IF_ERROR(mesh_.group(dim).Broadcast(all, 0));
  int64_t at = 0;
  for (auto& v : values) {
    v.copy_(all.narrow(0, at, v.numel()));
    at += v.numel();
  }
  return absl::OkStatus();
}

void FsdpModel::ScaleGrad(const at::Tensor& factor) {
  // A 0-d fp32 factor: the gradients are multiplied in fp32, as by a scalar.
  const at::Tensor f = factor.to(at::kFloat).reshape({});
  for (auto& u : units_) u->shard_grad.mul_(f);
}

}  // namespace atl::inner::parallel
