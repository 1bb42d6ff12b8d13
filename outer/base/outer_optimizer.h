// The outer optimizers of the service, in fp32 on flat spans, behind one interface with named
// state tensors (what the durable service state stores), chosen by name (outer.optimizer):
//   "nesterov"  SGD with momentum (Nesterov or heavy ball) on the averaged pseudo-gradient; with
//               momentum 0 it is plain SGD; async mode's delayed Nesterov (arXiv 2401.09135).
//               Defaults follow DiLoCo (arXiv 2311.08105): lr 0.7, momentum 0.9, Nesterov.
//   "sgd"       u = lr x g, no state.
// Adding one: a class implementing OuterOptimizer and a row of kOptimizers (outer_optimizer.cc).
#ifndef ATOLL_OUTER_BASE_OUTER_OPTIMIZER_H_
#define ATOLL_OUTER_BASE_OUTER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace atl::outer {

// The outer learning rate after its warmup: constant, or cosine down to min_lr_ratio x lr.
enum class LrDecay { kConstant, kCosine };
absl::Status ParseConfigValue(const std::string& text, LrDecay* value);
std::string ConfigValueText(LrDecay value);

struct OuterOptimizerConfig {
  double lr = 0.7;
  double momentum = 0.9;
  bool nesterov = true;
  // Delayed Nesterov (arXiv 2401.09135), for async mode where each contribution is one outer
  // gradient: 0 is off; N >= 1 updates the momentum only on every N-th gradient (see
  // ComputeUpdate). N = 1 is plain Nesterov, bit for bit.
  int momentum_delay = 0;
  // Outer learning-rate schedule over a fragment's rounds (sync mode): a linear warmup over the
  // first `warmup_rounds` rounds (round r uses lr * (r + 1) / (warmup_rounds + 1)), then
  // "constant" or "cosine" (from lr down to lr * min_lr_ratio at the last round).
  int warmup_rounds = 0;
  LrDecay decay = LrDecay::kConstant;
  double min_lr_ratio = 0;
  std::string name = "nesterov";  // which outer optimizer (OuterOptimizerNames())
};

absl::Status Validate(const OuterOptimizerConfig& config);

// The outer learning rate of round `round` of a fragment that runs `total_rounds` rounds (0:
// unknown, no decay).
double ScheduledLr(const OuterOptimizerConfig& config, uint64_t round, uint64_t total_rounds);

// One fragment's outer optimizer. The update u of an averaged outer gradient g is such that
// theta_new = theta - u; every copy of the global parameters applies u with the same fp32
// subtraction, which keeps them bit-identical. A step is done range by range, in any order or in
// parallel: Preview (the update, changing nothing, so that the service can check it before it
// commits to it), then Advance on the same ranges, then EndStep once.
class OuterOptimizer {
 public:
  virtual ~OuterOptimizer() = default;
  virtual const char* name() const = 0;

  // u[0, count) for elements [first, first + count) (g points at the first of them).
  virtual void Preview(const float* g, float* u, size_t first, size_t count) const = 0;
  virtual void Advance(const float* g, size_t first, size_t count) = 0;
  virtual void EndStep() = 0;
  // Preview + Advance + EndStep of the whole fragment.
  void ComputeUpdate(const float* g, float* u);
  size_t size() const { return size_; }

  // The learning rate of the next steps (a schedule sets it before each round's step).
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // Plain averaging for the next steps (a warm start): u = lr x g, the state untouched.
  void set_averaging(bool averaging) { averaging_ = averaging; }
  bool averaging() const { return averaging_; }
  // Whether the next step is u = float(lr) x g with no state read or written (LinearStep): then
  // any copy that knows g and the lr makes u itself, bit for bit (outer/base/update_recipe.h).
  virtual bool linear() const { return averaging_; }

  // The state, by name: tensors of the fragment's size and integer counters, in a fixed order
  // (the durable state stores them so).
  struct Tensor {
    std::string name;
    const std::vector<float>* values;
  };
  virtual std::vector<Tensor> StateTensors() const = 0;
  virtual std::vector<std::pair<std::string, int64_t>> StateCounters() const { return {}; }
  // Replaces the state: every tensor and counter this optimizer keeps, by name, sizes checked
  // against its own; all or nothing (INVALID_ARGUMENT naming what does not fit).
  virtual absl::Status Restore(std::vector<std::pair<std::string, std::vector<float>>> tensors,
                               const std::vector<std::pair<std::string, int64_t>>& counters) = 0;
  virtual std::unique_ptr<OuterOptimizer> Clone() const = 0;
  // Forgets the state, as a fresh optimizer (the learning rate and averaging kept). The step
  // guard calls it when it commits a round's plain average; every optimizer says what it forgets.
  virtual void Restart() = 0;

 protected:
  OuterOptimizer(double lr, size_t num_elements) : lr_(lr), size_(num_elements) {}
  double lr_;
  size_t size_;  // the fragment's elements
  bool averaging_ = false;
};

// What code outside an optimizer may know of it, from its row in the table (never from its name):
// a new optimizer states them, and eager updates and the planner follow.
struct OuterOptimizerTraits {
  // Its sync update is u = lr x g, linear in the round's contributions (before any warm start
  // averages): relayed updates apply, the planner models a linear commit.
  bool (*linear)(const OuterOptimizerConfig&);
  // d u / d g for a fresh gradient, in units of the gradient (eager updates' stand-in gain):
  // lr for a plain step, lr (1 + mu) for Nesterov momentum.
  double (*gain)(const OuterOptimizerConfig&);
};
// `config.name`'s traits (the name is validated).
const OuterOptimizerTraits& TraitsOf(const OuterOptimizerConfig& config);

// The outer optimizers this build has (for validation and help).
std::vector<std::string> OuterOptimizerNames();
// `config.name`'s optimizer for a fragment of `num_elements` (the name is validated).
std::unique_ptr<OuterOptimizer> MakeOuterOptimizer(const OuterOptimizerConfig& config,
                                                   size_t num_elements);

// SGD with (Nesterov) momentum, and delayed Nesterov with period N:
//   no momentum:  u = lr * g
//   momentum:     m = mu * m + g;  u = lr * m            (torch.optim.SGD semantics)
//   Nesterov:     m = mu * m + g;  u = lr * (g + mu * m)
//   delayed Nesterov with period N: b += g; on all but every N-th step u = lr * (g / N); on
//   every N-th step m = mu * m + b / N, u = lr * (g / N + mu * m), b = 0.
// State: "momentum" (with momentum), "buffer" and the counter "buffered" (delayed).
class NesterovOptimizer : public OuterOptimizer {
 public:
  NesterovOptimizer(const OuterOptimizerConfig& config, size_t num_elements);
  const char* name() const override { return "nesterov"; }
  void Preview(const float* g, float* u, size_t first, size_t count) const override;
  void Advance(const float* g, size_t first, size_t count) override;
  void EndStep() override;
  std::vector<Tensor> StateTensors() const override;
  std::vector<std::pair<std::string, int64_t>> StateCounters() const override;
  absl::Status Restore(std::vector<std::pair<std::string, std::vector<float>>> tensors,
                       const std::vector<std::pair<std::string, int64_t>>& counters) override;
  std::unique_ptr<OuterOptimizer> Clone() const override {
    return std::make_unique<NesterovOptimizer>(*this);
  }
  void Restart() override;
  bool linear() const override { return averaging_ || (momentum_.empty() && buffer_.empty()); }
  const std::vector<float>& momentum() const { return momentum_; }
  const std::vector<float>& buffer() const { return buffer_; }
  int buffered() const { return buffered_; }

 private:
  OuterOptimizerConfig config_;
  std::vector<float> momentum_;  // empty without momentum
  std::vector<float> buffer_;    // delayed Nesterov: outer gradients since the last momentum step
  int buffered_ = 0;
};

// theta -= u, elementwise in fp32: the one way every copy applies an outer update.
void ApplyUpdate(float* theta, const float* u, size_t n);
// u = lr x g, elementwise in fp32: the step of a linear outer optimizer, wherever it is made.
void LinearStep(float lr, const float* g, float* u, size_t n);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_OUTER_OPTIMIZER_H_
