#include "outer/outer_optimizer.h"

#include "compression/codec.h"
#include "outer/outer_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace atl::outer {

absl::Status Validate(const OuterOptimizerConfig& c) {
  if (!(c.lr > 0) || !std::isfinite(c.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("outer.lr must be positive, got ", c.lr));
  }
  if (!(c.momentum >= 0 && c.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.momentum must be in [0, 1), got ", c.momentum));
  }
  return absl::OkStatus();
}

OuterOptimizer::OuterOptimizer(const OuterOptimizerConfig& config, size_t num_elements)
    : config_(config), size_(num_elements), momentum_(config.momentum > 0 ? num_elements : 0, 0.0f) {}

absl::Status Validate(const OuterConfig& c) {
  if (c.run_id.empty()) return absl::InvalidArgumentError("outer.run_id must not be empty");
  if (c.sync_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("outer.sync_every must be >= 1, got ", c.sync_every));
  }
  if (c.islands < 1) {
    return absl::InvalidArgumentError(absl::StrCat("outer.islands must be >= 1, got ", c.islands));
  }
  if (c.min_islands < 1 || c.min_islands > c.islands) {
    return absl::InvalidArgumentError(absl::StrCat("outer.min_islands must be in [1, outer.islands = ",
                                                   c.islands, "], got ", c.min_islands));
  }
  if (!(c.round_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.round_timeout_s must be positive, got ", c.round_timeout_s));
  }
  if (!(c.rpc_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.rpc_timeout_s must be positive, got ", c.rpc_timeout_s));
  }
  if (auto codec = compression::ParseCodec(c.codec); !codec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("outer.codec: ", codec.status().message()));
  }
  return Validate(c.optimizer);
}

void OuterOptimizer::ComputeUpdate(const float* g, float* u) {
  const float lr = float(config_.lr), mu = float(config_.momentum);
  const size_t n = size_;
  if (momentum_.empty()) {
    for (size_t i = 0; i < n; ++i) u[i] = lr * g[i];
    return;
  }
  float* m = momentum_.data();
  if (config_.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      m[i] = mu * m[i] + g[i];
      u[i] = lr * (g[i] + mu * m[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      m[i] = mu * m[i] + g[i];
      u[i] = lr * m[i];
    }
  }
}

void ApplyUpdate(float* theta, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) theta[i] -= u[i];
}

}  // namespace atl::outer
