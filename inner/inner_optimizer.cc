#include "inner/inner_optimizer.h"

#include "inner/muon.h"
#include "inner/parallel/fsdp.h"

namespace atl::inner {
namespace {

class AdamWOptimizer final : public InnerOptimizer {
 public:
  AdamWOptimizer(std::vector<AdamWParam> params, const AdamWOptions& options)
      : adamw_(std::move(params), options) {}

  absl::Status Step(double lr) override {
    adamw_.Step(lr);
    return absl::OkStatus();
  }
  void ZeroGrad() override { adamw_.ZeroGrad(); }
  void Reset() override { adamw_.Reset(); }
  int64_t step() const override { return adamw_.step(); }
  void SetStep(int64_t step) override { adamw_.SetStep(step); }
  std::vector<NamedTensor> ShardState(size_t i) const override { return adamw_.SlotState(i); }

 private:
  AdamW adamw_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InnerOptimizer>> NewInnerOptimizer(const OptimConfig& optim,
                                                                 const ModelConfig& config,
                                                                 parallel::FsdpModel& model) {
  switch (optim.name) {
    case InnerOptimizerName::kAdamW: {
      std::vector<AdamWParam> params;
      for (auto& s : model.shards()) params.push_back({s.name, s.value, s.grad, s.decay});
      return std::unique_ptr<InnerOptimizer>(new AdamWOptimizer(std::move(params), optim.adamw));
    }
    case InnerOptimizerName::kMuon:
      return NewMuon(optim, config, model);
  }
  return absl::InvalidArgumentError("unknown optim.name");
}

}  // namespace atl::inner
