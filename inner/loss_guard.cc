#include "inner/loss_guard.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"

namespace atl::inner {
namespace {

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + mid) + hi) / 2;
}

}  // namespace

LossSpikeGuard::LossSpikeGuard(int window, double factor) : window_(window), factor_(factor) {}

std::optional<std::string> LossSpikeGuard::Check(double loss) {
  if (!std::isfinite(loss)) return absl::StrFormat("non-finite loss %g", loss);
  if (window_ <= 0) return std::nullopt;
  if (int(recent_.size()) >= std::max(2, window_ / 2)) {
    const std::vector<double> v(recent_.begin(), recent_.end());
    const double median = Median(v);
    std::vector<double> dev(v.size());
    for (size_t i = 0; i < v.size(); ++i) dev[i] = std::fabs(v[i] - median);
    const double sigma = std::max(1.4826 * Median(dev), 1e-3 * std::fabs(median));
    const double limit = median + factor_ * sigma;
    if (loss > limit) {
      return absl::StrFormat("loss %.4f is a spike: above %.4f (median %.4f + %.1f x %.4f)", loss,
                             limit, median, factor_, sigma);
    }
  }
  recent_.push_back(loss);
  if (int(recent_.size()) > window_) recent_.pop_front();
  return std::nullopt;
}

}  // namespace atl::inner
