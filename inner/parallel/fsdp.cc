#include "inner/parallel/fsdp.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "inner/torch_compat.h"

namespace atl::inner::parallel {

struct FsdpGpt::Unit {
  std::string name;
  std::vector<std::pair<std::string, at::Tensor>> params;  // the module's, in model order
  std::vector<int64_t> offsets;                            // of each within the unit's flat
  int64_t numel = 0, padded = 0, shard_numel = 0;
  at::Tensor shard, shard_grad;  // this rank's part (the whole unit with one rank)
  at::Tensor full, full_grad;    // the whole unit; storage empty while not in use (sharded)
  at::Tensor scatter;            // sharded: the reduce-scattered gradient of one micro-batch
  std::unique_ptr<Work> pending;  // an all-gather in flight
  bool gathered = false;
  bool is_block = false;
};

namespace {

// "tok_emb.weight" -> 0, "blocks.3.x" -> 4, "ln_f.weight" -> n_layer + 1.
int UnitOf(const std::string& name, int n_layer) {
  if (absl::StartsWith(name, "blocks.")) {
    int block = 0;
    const std::string rest = name.substr(7);
    (void)absl::SimpleAtoi(rest.substr(0, rest.find('.')), &block);
    return 1 + block;
  }
  if (absl::StartsWith(name, "tok_emb") || absl::StartsWith(name, "pos_emb")) return 0;
  return n_layer + 1;
}

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

FsdpGpt::FsdpGpt(const ModelConfig& config, DeviceMesh& mesh, FsdpOptions options)
    : mesh_(mesh),
      tp_(mesh.shape().tp > 1 ? std::make_unique<TpGroup>(mesh.group(MeshDim::kTp)) : nullptr),
      model_(config, tp_.get()),
      options_(options) {}

FsdpGpt::~FsdpGpt() {
  for (auto& u : units_) {
    if (u->pending) u->pending->Wait().IgnoreError();
  }
}

bool FsdpGpt::sharded() const { return mesh_.shape().dp_shard > 1; }

absl::StatusOr<std::unique_ptr<FsdpGpt>> FsdpGpt::Create(const ModelConfig& config,
                                                         DeviceMesh& mesh, bool cuda,
                                                         FsdpOptions options) {
  if (auto s = Validate(config); !s.ok()) return s;
  if (mesh.shape().pp > 1) {
    return absl::UnimplementedError(
        "parallelism.pipeline_parallel_degree must be 1: pipeline parallelism is not built yet");
  }
  if (auto s = ValidateTensorParallel(config, mesh.shape().tp); !s.ok()) return s;
  // Initialized from config.init_seed on the CPU: every rank's part of the same model.
  std::unique_ptr<FsdpGpt> f(new FsdpGpt(config, mesh, options));
  if (cuda) f->model_->to(torch::Device(torch::kCUDA, 0));
  if (auto s = f->BuildUnits(); !s.ok()) return s;
  return f;
}

absl::Status FsdpGpt::BuildUnits() {
  torch::NoGradGuard no_grad;
  const ModelConfig& config = model_->config();
  const int n_layer = config.n_layer;
  units_.clear();
  for (int u = 0; u < n_layer + 2; ++u) {
    units_.push_back(std::make_unique<Unit>());
    units_[u]->name = u == 0 ? "embed" : (u <= n_layer ? absl::StrCat("blocks.", u - 1) : "head");
    units_[u]->is_block = u >= 1 && u <= n_layer;
  }
  std::map<std::string, std::vector<int64_t>> whole_shape;
  for (auto& [name, shape] : ParameterShapes(config)) whole_shape[name] = shape;
  // Each unit's parameters: those whole on every TP rank first, then the TP-split ones.
  for (auto& [name, p] : NamedParameters(*model_)) {
    units_[size_t(UnitOf(name, n_layer))]->params.emplace_back(name, p);
  }
  for (auto& u : units_) {
    std::stable_partition(u->params.begin(), u->params.end(),
                          [](const auto& named) { return TpReplicated(named.first); });
    for (const auto& [name, p] : u->params) {
      u->offsets.push_back(u->numel);
      u->numel += p.numel();
    }
  }
  const int64_t ranks = mesh_.shape().dp_shard;
  const int64_t me = mesh_.coordinate(MeshDim::kDpShard);
  const int tp_rank = mesh_.coordinate(MeshDim::kTp), tp_size = mesh_.shape().tp;
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    Unit& u = *units_[ui];
    u.padded = (u.numel + ranks - 1) / ranks * ranks;
    u.shard_numel = u.padded / ranks;
    const auto options = u.params.front().second.options();
    at::Tensor flat = at::zeros({u.padded}, options);
    for (size_t i = 0; i < u.params.size(); ++i) {
      const auto& [name, p] = u.params[i];
      flat.narrow(0, u.offsets[i], p.numel()).copy_(CanonicalFlat(name, p));
    }
    if (sharded()) {
      u.shard = flat.narrow(0, me * u.shard_numel, u.shard_numel).clone();
      u.shard_grad = at::zeros({u.shard_numel}, options);
      u.scatter = at::empty({u.shard_numel}, options);
      u.full = at::empty({u.padded}, options);
      u.full_grad = at::empty({u.padded}, options);
    } else {
      u.full = u.shard = flat;
      u.full_grad = u.shard_grad = at::zeros({u.padded}, options);
      u.gathered = true;
    }
    // The module's parameters (and their gradients) become views of the unit's flat buffers.
    for (size_t i = 0; i < u.params.size(); ++i) {
      auto& [name, p] = u.params[i];
      const auto shape = p.sizes().vec();
      p.set_data(ShapedView(name, u.full.narrow(0, u.offsets[i], p.numel()), shape));
      p.mutable_grad() = ShapedView(name, u.full_grad.narrow(0, u.offsets[i], p.numel()), shape);
      // The part of this parameter inside this rank's shard.
      const int64_t lo = std::max(u.offsets[i], me * u.shard_numel);
      const int64_t hi = std::min(u.offsets[i] + p.numel(), (me + 1) * u.shard_numel);
      if (lo >= hi) continue;
      ParamShard s;
      s.name = name;
      s.shape = whole_shape.at(name);
      s.runs = Runs(TpRanges(name, s.shape, tp_rank, tp_size), lo - u.offsets[i],
                    hi - u.offsets[i]);
      s.value = u.shard.narrow(0, lo - me * u.shard_numel, hi - lo);
      s.grad = u.shard_grad.narrow(0, lo - me * u.shard_numel, hi - lo);
      s.decay = shape.size() >= 2;
      s.replica = tp_rank > 0 && TpReplicated(name);
      s.unit = int(ui);
      shards_.push_back(std::move(s));
    }
    if (sharded()) {  // gathered only when needed, from now on
      compat::ResizeStorage(u.full, 0);
      compat::ResizeStorage(u.full_grad, 0);
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> FsdpGpt::unit_parameters(int u) const {
  std::vector<std::string> names;
  for (const auto& [name, p] : units_[size_t(u)]->params) names.push_back(name);
  return names;
}

FsdpMemory FsdpGpt::memory() const {
  FsdpMemory m;
  for (const auto& u : units_) m.shard_bytes += 2 * u->shard_numel * int64_t(sizeof(float));
  m.peak_gathered_bytes = peak_live_bytes_;
  return m;
}

void FsdpGpt::Prefetch(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded() || unit.gathered || unit.pending) return;
  compat::ResizeStorage(unit.full, size_t(unit.padded) * sizeof(float));
  live_bytes_ += unit.padded * int64_t(sizeof(float));
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  unit.pending = mesh_.group(MeshDim::kDpShard).AllGatherAsync(unit.shard, unit.full);
}

absl::Status FsdpGpt::Gather(int u) {
  Unit& unit = *units_[size_t(u)];
  if (unit.gathered) return absl::OkStatus();
  Prefetch(u);
  auto s = unit.pending->Wait();
  unit.pending.reset();
  unit.gathered = s.ok();
  return s;
}

void FsdpGpt::Release(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded() || !unit.gathered) return;
  compat::ResizeStorage(unit.full, 0);
  live_bytes_ -= unit.padded * int64_t(sizeof(float));
  unit.gathered = false;
}

void FsdpGpt::PrepareGrad(int u) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded()) return;
  compat::ResizeStorage(unit.full_grad, size_t(unit.padded) * sizeof(float));
  live_bytes_ += unit.padded * int64_t(sizeof(float));
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  unit.full_grad.zero_();
}

absl::Status FsdpGpt::ScatterGrad(int u, double) {
  Unit& unit = *units_[size_t(u)];
  if (!sharded()) return absl::OkStatus();
  auto s = mesh_.group(MeshDim::kDpShard).ReduceScatterSum(unit.full_grad, unit.scatter);
  compat::ResizeStorage(unit.full_grad, 0);
  live_bytes_ -= unit.padded * int64_t(sizeof(float));
  if (!s.ok()) return s;
  unit.shard_grad.add_(unit.scatter);
  return absl::OkStatus();
}

at::Tensor FsdpGpt::RunUnit(int u, const at::Tensor& x) {
  const int n_layer = model_->config().n_layer;
  if (u == 0) return model_->Embed(x);
  if (u <= n_layer) return model_->RunBlock(u - 1, x);
  return model_->Logits(x);
}

// The forward pass unit by unit. Training: each unit's input is a leaf (its gradient is what the
// unit below receives in backward) and its output keeps the unit's graph, except for
// checkpointed blocks, which run without a graph and are recomputed in backward.
absl::StatusOr<at::Tensor> FsdpGpt::Forward(const at::Tensor& inputs, const at::Tensor& targets,
                                           bool train, std::vector<at::Tensor>* unit_inputs,
                                           std::vector<at::Tensor>* unit_outputs) {
  const int last = num_units() - 1;
  at::Tensor x = inputs;
  for (int u = 0; u <= last; ++u) {
    if (auto s = Gather(u); !s.ok()) return s;
    if (options_.prefetch && u < last) Prefetch(u + 1);
    if (train && u > 0) x = x.detach().requires_grad_(true);
    if (train) (*unit_inputs)[size_t(u)] = x;
    at::Tensor out;
    if (!train || (options_.checkpoint_activations && units_[size_t(u)]->is_block)) {
      torch::NoGradGuard no_grad;
      out = RunUnit(u, x);
    } else {
      out = RunUnit(u, x);
    }
    if (u == last) {
      out = torch::nn::functional::cross_entropy(out.view({-1, out.size(-1)}),
                                                 targets.reshape({-1}));
    }
    if (train) (*unit_outputs)[size_t(u)] = out;
    // The last unit's backward comes next: it stays gathered.
    if (u < last || !train) Release(u);
    x = out;
  }
  return x;
}

// A collective of tensor parallelism that fails inside autograd throws: its error, as a status.
template <typename T>
absl::StatusOr<T> FsdpGpt::Guarded(const std::function<absl::StatusOr<T>()>& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    if (tp_ != nullptr && !tp_->status().ok()) return tp_->status();
    return absl::InternalError(absl::StrCat("training step failed: ", e.what()));
  }
}

absl::StatusOr<double> FsdpGpt::ForwardBackward(const at::Tensor& inputs, const at::Tensor& targets,
                                                double grad_scale) {
  return Guarded<double>([&] { return RunForwardBackward(inputs, targets, grad_scale); });
}

absl::StatusOr<double> FsdpGpt::RunForwardBackward(const at::Tensor& inputs,
                                                   const at::Tensor& targets, double grad_scale) {
  const int last = num_units() - 1;
  const size_t units = units_.size();
  std::vector<at::Tensor> unit_inputs(units), unit_outputs(units);
  const at::Tensor rng = options_.checkpoint_activations ? compat::GetDefaultCpuRngState()
                                                        : at::Tensor();
  auto loss = Forward(inputs, targets, /*train=*/true, &unit_inputs, &unit_outputs);
  if (!loss.ok()) return loss.status();
  const double value = loss->item<double>();
  at::Tensor grad = at::full({}, grad_scale, loss->options());
  for (int u = last; u >= 0; --u) {
    if (auto s = Gather(u); !s.ok()) return s;
    PrepareGrad(u);
    at::Tensor out = unit_outputs[size_t(u)];
    if (options_.checkpoint_activations && units_[size_t(u)]->is_block) {
      // The same dropout draws as in the forward pass: the generator as it was then. (CPU's; a
      // CUDA build with dropout would need the device generator too.)
      const at::Tensor now = compat::GetDefaultCpuRngState();
      compat::SetDefaultCpuRngState(rng);
      out = RunUnit(u, unit_inputs[size_t(u)]);
      compat::SetDefaultCpuRngState(now);
    }
    torch::autograd::backward({out}, {grad});
    unit_outputs[size_t(u)] = at::Tensor();
    if (u > 0) grad = unit_inputs[size_t(u)].grad();
    unit_inputs[size_t(u)] = at::Tensor();
    // Two units at most are whole at once: u's parameters go before the unit below is gathered
    // (in the background, while u's gradients are reduce-scattered).
    Release(u);
    if (options_.prefetch && u > 0) Prefetch(u - 1);
    if (auto s = ScatterGrad(u, grad_scale); !s.ok()) return s;
  }
  return value;
}

absl::Status FsdpGpt::ReduceReplicas() {
  if (mesh_.shape().dp_replicate == 1) return absl::OkStatus();
  for (auto& u : units_) {
    if (auto s = mesh_.group(MeshDim::kDpReplicate).AllReduceSum(u->shard_grad); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> FsdpGpt::Loss(const at::Tensor& inputs, const at::Tensor& targets) {
  return Guarded<double>([&]() -> absl::StatusOr<double> {
    torch::NoGradGuard no_grad;
    auto loss = Forward(inputs, targets, /*train=*/false, nullptr, nullptr);
    if (!loss.ok()) return loss.status();
    return loss->item<double>();
  });
}

void FsdpGpt::ZeroGrad() {
  for (auto& u : units_) u->shard_grad.zero_();
}

double FsdpGpt::GradSquaredNorm() const {
  double sum = 0;
  for (const auto& s : shards_) {
    if (s.replica) continue;
    const double n = s.grad.norm().item<double>();
    sum += n * n;
  }
  return sum;
}

absl::Status FsdpGpt::BroadcastReplicas(const std::vector<size_t>& shards) {
  if (tp_ == nullptr || shards.empty()) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> values;
  for (size_t i : shards) values.push_back(shards_[i].value);
  at::Tensor all = at::cat(values);  // one broadcast for all of them
  if (auto s = mesh_.group(MeshDim::kTp).Broadcast(all, 0); !s.ok()) return s;
  int64_t at = 0;
  for (auto& v : values) {
    v.copy_(all.narrow(0, at, v.numel()));
    at += v.numel();
  }
  return absl::OkStatus();
}

void FsdpGpt::ScaleGrad(double factor) {
  for (auto& u : units_) u->shard_grad.mul_(factor);
}

}  // namespace atl::inner::parallel
