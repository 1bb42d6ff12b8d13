#include "src/service/loss_probe.h"

#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/data.h"
#include "inner/model.h"
#include "src/store/flat_params.h"
#include "src/text/token_shards.h"

namespace atl {

namespace {

class ModelLossProbe : public outer::LossProbe {
 public:
  ModelLossProbe(const Config& config, std::vector<std::vector<size_t>> fragments,
                 torch::Tensor inputs, torch::Tensor targets)
      : model_(inner::BuildModel(config.model)),
        plan_(inner::PlanOf(config.model)),
        params_(inner::NamedParameters(*model_)),
        fragments_(std::move(fragments)),
        inputs_(std::move(inputs)),
        targets_(std::move(targets)),
        batch_(config.train.batch_size) {
    model_->eval();
  }

  absl::StatusOr<std::vector<double>> Losses(uint32_t fragment, const float* params,
                                             uint64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    ATL_RETURN_IF_ERROR(SetLocked(fragment, params, n));
    torch::NoGradGuard no_grad;
    const int64_t rows = inputs_.size(0);
    std::vector<double> out;
    out.reserve(size_t(rows));
    for (int64_t r = 0; r < rows; r += batch_) {
      const int64_t m = std::min<int64_t>(batch_, rows - r);
      const torch::Tensor logits = model_->forward(inputs_.narrow(0, r, m));  // [m, T, V]
      const torch::Tensor per_token = torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}), targets_.narrow(0, r, m).reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
      const torch::Tensor per_row = per_token.reshape({m, -1}).mean(1).to(torch::kDouble);
      const double* v = per_row.data_ptr<double>();
      out.insert(out.end(), v, v + m);
    }
    return out;
  }

  void Set(uint32_t fragment, const float* params, uint64_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    SetLocked(fragment, params, n).IgnoreError();  // the sizes are the service's own
  }

 private:
  absl::Status SetLocked(uint32_t fragment, const float* params, uint64_t n) {
    if (fragment >= fragments_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("the probe has no fragment ", fragment));
    }
    uint64_t expected = 0;
    for (size_t i : fragments_[fragment]) expected += uint64_t(params_[i].second.numel());
    if (n != expected) {
      return absl::InvalidArgumentError(absl::StrCat("fragment ", fragment, " holds ", expected,
                                                     " elements, the probe was given ", n));
    }
    torch::NoGradGuard no_grad;
    LoadFlat(plan_, std::vector<float>(params, params + n), params_, fragments_[fragment]);
    return absl::OkStatus();
  }

  std::mutex mu_;
  inner::CausalLm model_;
  const inner::ParallelPlan plan_;
  const NamedParams params_;
  const std::vector<std::vector<size_t>> fragments_;
  const torch::Tensor inputs_, targets_;
  const int64_t batch_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<outer::LossProbe>> MakeLossProbe(
    const Config& config, const std::vector<std::vector<size_t>>& fragments,
    const std::vector<std::vector<float>>& initial) {
  ATL_ASSIGN_OR_RETURN(auto data, text::LoadDataset(config.data, config.model));
  const inner::WindowSet& val = data->val;
  const size_t rows = std::min(val.size(), size_t(config.outer.probe_batches) *
                                               size_t(config.train.batch_size));
  if (rows == 0) {
    return absl::FailedPreconditionError(
        "outer.scoring = loss_probe needs validation data (data.val_path or data.val_fraction)");
  }
  // The rows: windows spread evenly over the held-out windows the evaluation does not read (it
  // reads the first train.eval_batches x train.batch_size), so the probe that sets the weights
  // does not select on the reported val_loss's text, and its rows sample the held-out documents
  // rather than one passage: consecutive windows of one story move together, which makes a
  // paired t over them overstate how sure it is, the same way in every round. A split too small
  // for both gives the probe its last `rows` windows.
  const size_t evaluated = size_t(config.train.eval_batches) * size_t(config.train.batch_size);
  const size_t begin = std::min(evaluated, val.size() - rows);
  const size_t span = val.size() - begin;
  const int64_t t = config.model.context;
  auto inputs = torch::empty({int64_t(rows), t}, torch::kLong);
  auto targets = torch::empty({int64_t(rows), t}, torch::kLong);
  for (size_t i = 0; i < rows; ++i) {
    val.Fill(begin + i * span / rows, inputs.data_ptr<int64_t>() + int64_t(i) * t,
             targets.data_ptr<int64_t>() + int64_t(i) * t);
  }
  auto probe = std::make_shared<ModelLossProbe>(config, fragments, inputs, targets);
  for (size_t f = 0; f < initial.size(); ++f) {
    if (!initial[f].empty()) probe->Set(uint32_t(f), initial[f].data(), initial[f].size());
  }
  return probe;
}

}  // namespace atl
