// The outer optimizer of DiLoCo: SGD on the averaged pseudo-gradient, with optional (Nesterov)
// momentum, in fp32 on flat spans. Defaults follow DiLoCo (arXiv 2311.08105): lr 0.7, momentum 0.9,
// Nesterov.
#ifndef ATOLL_OUTER_OUTER_OPTIMIZER_H_
#define ATOLL_OUTER_OUTER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
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
};

absl::Status Validate(const OuterOptimizerConfig& config);

// The outer learning rate of round `round` of a fragment that runs `total_rounds` rounds (0:
// unknown, no decay).
double ScheduledLr(const OuterOptimizerConfig& config, uint64_t round, uint64_t total_rounds);

class OuterOptimizer {
 public:
  OuterOptimizer(const OuterOptimizerConfig& config, size_t num_elements);

  // From the averaged outer gradient g, advances the momentum and writes the update u such that
  // theta_new = theta - u. Every copy of the global parameters applies u with the same fp32
  // subtraction, which keeps them bit-identical.
  //   no momentum:  u = lr * g
  //   momentum:     m = mu * m + g;  u = lr * m            (torch.optim.SGD semantics)
  //   Nesterov:     m = mu * m + g;  u = lr * (g + mu * m)
  //   delayed Nesterov with period N: b += g; on all but every N-th call u = lr * (g / N); on
  //   every N-th call m = mu * m + b / N, u = lr * (g / N + mu * m), b = 0.
  // Preview + Advance.
  void ComputeUpdate(const float* g, float* u);
  // The update ComputeUpdate would write, without changing any state (so that the service can
  // check an update before it commits to it).
  void Preview(const float* g, float* u) const;
  // Advances the momentum (and delayed Nesterov's buffer) by g, as ComputeUpdate does.
  void Advance(const float* g);
  // The same on elements [first, first + count) (g points at the first of them): a step done
  // range by range, in any order or in parallel, then closed once by EndStep.
  void Preview(const float* g, float* u, size_t first, size_t count) const;
  void Advance(const float* g, size_t first, size_t count);
  void EndStep();

  // The learning rate of the next steps (a schedule sets it before each round's step).
  void set_lr(double lr) { config_.lr = lr; }
  // Plain averaging for the next steps (a warm start): u = lr * g, the momentum (and delayed
  // Nesterov's buffer) untouched.
  void set_averaging(bool averaging) { averaging_ = averaging; }
  double lr() const { return config_.lr; }
  const std::vector<float>& momentum() const { return momentum_; }
  std::vector<float>& mutable_momentum() { return momentum_; }
  // Delayed Nesterov's buffer and how many gradients it holds (for the service's durable state).
  const std::vector<float>& buffer() const { return buffer_; }
  int buffered() const { return buffered_; }
  // All-or-nothing: sizes must match this optimizer's.
  absl::Status Restore(std::vector<float> momentum, std::vector<float> buffer, int buffered);

 private:
  OuterOptimizerConfig config_;
  size_t size_;
  std::vector<float> momentum_;  // empty without momentum
  std::vector<float> buffer_;    // delayed Nesterov: outer gradients since the last momentum step
  int buffered_ = 0;
  bool averaging_ = false;
};

// theta -= u, elementwise in fp32: the one way every copy applies an outer update.
void ApplyUpdate(float* theta, const float* u, size_t n);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_OUTER_OPTIMIZER_H_
