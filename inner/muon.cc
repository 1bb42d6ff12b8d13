#include "inner/muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "compression/status_macros.h"
#include "inner/model.h"
#include "inner/parallel/fsdp.h"

namespace atl::inner {
namespace {

// The quintic's coefficients (Jordan et al.): its slope at 0 is large, so that small singular
// values grow quickly, and it maps [0, 1] near 1 in a few steps.
constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;

bool IsHiddenMatrix(const ParamPlan& plan, const std::vector<int64_t>& shape) {
  return plan.block >= 0 && shape.size() == 2;
}

class Muon final : public InnerOptimizer {
 public:
  Muon(const OptimConfig& optim, const ModelConfig& config, parallel::FsdpModel& model);

  absl::Status Step(double lr) override;
  void ZeroGrad() override;
  void Reset() override;
  int64_t step() const override { return step_; }
  void SetStep(int64_t step) override {
    step_ = step;
    adamw_->SetStep(step);
  }
  std::vector<NamedTensor> ShardState(size_t i) const override;

 private:
  // A matrix of this rank's pipeline stage, at `offset` in the buffer that gathers them.
  struct Matrix {
    std::string name;
    std::vector<int64_t> shape;  // whole, [out, in]
    ParamPlan plan;
    int64_t offset = 0;
    int shard = -1;  // its shard in model.shards(); -1 where this rank holds none of it
    at::Tensor momentum;  // shaped as the shard
  };

  absl::Status GatherDirections(at::Tensor& whole);
  void ApplyOrthogonalized(const at::Tensor& whole, double lr);

  parallel::FsdpModel& model_;
  const MuonOptions options_;
  const double weight_decay_;
  std::vector<Matrix> matrices_;
  int64_t gathered_numel_ = 0;
  // Per shard: the index of its matrix, or -(1 + its AdamW slot).
  std::vector<int> route_;
  std::unique_ptr<AdamW> adamw_;
  at::Tensor whole_;  // the stage's matrices' directions, whole: kept between steps
  int64_t step_ = 0;
};

Muon::Muon(const OptimConfig& optim, const ModelConfig& config, parallel::FsdpModel& model)
    : model_(model), options_(optim.muon), weight_decay_(optim.adamw.weight_decay) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, shape] : ParameterShapes(config)) shapes[name] = shape;
  // The stage's matrices in model order: the same list, at the same offsets, on every rank of
  // the stage, whatever parts of them each holds.
  std::map<std::string, int> matrix_of;
  for (int u = 0; u < model.num_units(); ++u) {
    for (const auto& name : model.unit_parameters(u)) {
      const ParamPlan plan = PlanOf(model.plan(), name);
      const auto& shape = shapes.at(name);
      if (!IsHiddenMatrix(plan, shape)) continue;
      matrix_of[name] = int(matrices_.size());
      matrices_.push_back({name, shape, plan, gathered_numel_});
      gathered_numel_ += shape[0] * shape[1];
    }
  }
  std::vector<AdamWParam> rest;
  const auto& shards = model.shards();
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto& s = shards[i];
    auto it = matrix_of.find(s.name);
    if (it != matrix_of.end()) {
      Matrix& m = matrices_[it->second];
      m.shard = int(i);
      m.momentum = at::zeros_like(s.value);
      route_.push_back(it->second);
    } else {
      route_.push_back(-1 - int(rest.size()));
      rest.push_back({s.name, s.value, s.grad, s.decay});
    }
  }
  const auto options =
      shards.empty() ? at::TensorOptions().dtype(at::kFloat) : shards[0].value.options();
  whole_ = at::zeros({gathered_numel_}, options);
  adamw_ = std::make_unique<AdamW>(std::move(rest), optim.adamw);
}

absl::Status Muon::Step(double lr) {
  at::NoGradGuard no_grad;
  step_ += 1;
  adamw_->Step(lr);
  if (matrices_.empty()) return absl::OkStatus();
  whole_.zero_();
  ATL_RETURN_IF_ERROR(GatherDirections(whole_));
  ApplyOrthogonalized(whole_, lr);
  return absl::OkStatus();
}

// The momentum steps on this rank's parts; the directions U of every matrix of the stage, whole,
// in `whole` on every rank of the stage.
absl::Status Muon::GatherDirections(at::Tensor& whole) {
  const auto& shards = model_.shards();
  for (auto& m : matrices_) {
    if (m.shard < 0) continue;
    const parallel::ParamShard& s = shards[size_t(m.shard)];
    m.momentum.mul_(options_.momentum).add_(s.grad);
    const at::Tensor u = options_.nesterov ? s.grad.add(m.momentum, options_.momentum) : m.momentum;
    if (s.replica) continue;  // TP rank 0 places it
    int64_t at = 0;
    for (const auto& [offset, count] : s.runs) {
      whole.narrow(0, m.offset + offset, count).copy_(u.narrow(0, at, count));
      at += count;
    }
  }
  // Each element has one owner in the dp_shard x tp group, the others add zeros: exact sums.
  for (auto dim : {parallel::MeshDim::kDpShard, parallel::MeshDim::kTp}) {
    auto& group = model_.mesh().group(dim);
    if (group.size() > 1) ATL_RETURN_IF_ERROR(group.AllReduceSum(whole));
  }
  return absl::OkStatus();
}

void Muon::ApplyOrthogonalized(const at::Tensor& whole, double lr) {
  auto& shards = model_.shards();
  for (const auto& m : matrices_) {
    if (m.shard < 0) continue;
    const at::Tensor w = ShapedView(m.plan, whole.narrow(0, m.offset, m.shape[0] * m.shape[1]),
                                    m.shape);
    const int64_t rows = m.shape[0] / m.plan.parts, cols = m.shape[1];
    std::vector<at::Tensor> parts;
    for (int p = 0; p < m.plan.parts; ++p) {
      parts.push_back(NewtonSchulz(w.narrow(0, p * rows, rows), options_.ns_steps));
    }
    const at::Tensor o = CanonicalFlat(m.plan, parts.size() == 1 ? parts[0] : at::cat(parts, 0));
    const double scale = 0.2 * std::sqrt(double(std::max(rows, cols)));
    parallel::ParamShard& s = shards[size_t(m.shard)];
    if (weight_decay_ != 0) s.value.mul_(1 - lr * weight_decay_);
    int64_t at = 0;
    for (const auto& [offset, count] : s.runs) {
      s.value.narrow(0, at, count).add_(o.narrow(0, offset, count), -lr * scale);
      at += count;
    }
  }
}

void Muon::ZeroGrad() {
  adamw_->ZeroGrad();
  for (const auto& m : matrices_) {
    if (m.shard >= 0) model_.shards()[size_t(m.shard)].grad.zero_();
  }
}

void Muon::Reset() {
  step_ = 0;
  adamw_->Reset();
  for (auto& m : matrices_) {
    if (m.momentum.defined()) m.momentum.zero_();
  }
}

std::vector<NamedTensor> Muon::ShardState(size_t i) const {
  const int r = route_[i];
  if (r >= 0) return {{"momentum", matrices_[size_t(r)].momentum}};
  return adamw_->SlotState(size_t(-1 - r));
}

}  // namespace

at::Tensor NewtonSchulz(const at::Tensor& g, int steps) {
  at::Tensor x = g.to(at::kFloat);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() + 1e-7);  // a tensor: no host sync
  for (int k = 0; k < steps; ++k) {
    const at::Tensor a = at::mm(x, x.t());
    const at::Tensor b = at::addmm(a, a, a, /*beta=*/kB, /*alpha=*/kC);  // b a + c a a
    x = at::addmm(x, b, x, /*beta=*/kA, /*alpha=*/1.0);                  // a x + b x
  }
  return tall ? x.t() : x;
}

std::unique_ptr<InnerOptimizer> NewMuon(const OptimConfig& optim, const ModelConfig& config,
                                        parallel::FsdpModel& model) {
  return std::make_unique<Muon>(optim, config, model);
}

}  // namespace atl::inner
