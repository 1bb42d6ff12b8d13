// Loss-spike guard: tells a training loop when a step's loss is not to be trusted: non-finite, or
// far above the recent typical loss. Robust to the loss's own noise and trend: the rule compares
// against the median of a window of recent accepted losses and their median absolute deviation.
// Pure logic, no torch.
#ifndef ATOLL_INNER_LOSS_GUARD_H_
#define ATOLL_INNER_LOSS_GUARD_H_

#include <deque>
#include <optional>
#include <string>

namespace atl::inner {

class LossSpikeGuard {
 public:
  // window: recent accepted losses to compare against (0: only non-finite losses are flagged);
  // factor: how many robust standard deviations (1.4826 x MAD, at least 0.1% of the median)
  // above the median a loss may be.
  LossSpikeGuard(int window, double factor);

  // A reason when `loss` is non-finite or a spike (judged once half the window is full); the
  // loss is then left out of the window. Otherwise nullopt, and the loss joins the window.
  std::optional<std::string> Check(double loss);
  void Clear() { recent_.clear(); }

 private:
  int window_;
  double factor_;
  std::deque<double> recent_;
};

}  // namespace atl::inner

#endif  // ATOLL_INNER_LOSS_GUARD_H_
