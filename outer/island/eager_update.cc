#include "outer/island/eager_update.h"

#include <algorithm>

namespace atl::outer {

double EagerGain(const OuterOptimizerConfig& config) { return TraitsOf(config).gain(config); }

std::vector<float> EagerUpdate::StandIn(const std::vector<float>& global,
                                        const std::vector<float>& local) {
  const size_t n = global.size();
  if (last_update_.size() != n) last_update_.assign(n, 0.0f);
  if (last_delta_.size() != n) last_delta_.assign(n, 0.0f);
  const float share = float(gain_ / std::max<uint32_t>(1, contributors_));
  stand_in_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float delta = global[i] - local[i];
    const float u_hat = last_update_[i] + share * (delta - last_delta_[i]);
    stand_in_[i] = global[i] - u_hat;
    last_delta_[i] = delta;
  }
  global_at_push_ = global;
  return stand_in_;
}

void EagerUpdate::Land(const std::vector<float>& global_new, uint32_t contributors,
                       std::vector<float>& local) {
  for (size_t i = 0; i < local.size(); ++i) {
    local[i] += global_new[i] - stand_in_[i];
    last_update_[i] = global_at_push_[i] - global_new[i];
  }
  if (contributors > 0) contributors_ = contributors;
  stand_in_.clear();
  global_at_push_.clear();
}

void EagerUpdate::Forget() {
  last_update_.clear();
  last_delta_.clear();
  stand_in_.clear();
  global_at_push_.clear();
}

}  // namespace atl::outer
