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
  if (c.num_fragments < 1 || c.num_fragments > c.sync_every) {
    return absl::InvalidArgumentError(absl::StrCat("outer.num_fragments must be in [1, outer.sync_every = ",
                                                   c.sync_every, "], got ", c.num_fragments));
  }
  if (c.fragment_sync_delay < 0 || c.fragment_sync_delay >= c.sync_every) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.fragment_sync_delay must be in [0, outer.sync_every = ", c.sync_every, "), got ",
        c.fragment_sync_delay));
  }
  if (c.fragment_update_alpha > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.fragment_update_alpha must be in [0, 1] (or negative for the default), got ",
        c.fragment_update_alpha));
  }
  if (c.fragment_pattern != "strided" && c.fragment_pattern != "sequential") {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.fragment_pattern must be \"strided\" or \"sequential\", got \"", c.fragment_pattern, "\""));
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
