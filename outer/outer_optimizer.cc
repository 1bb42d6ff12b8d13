#include "outer/outer_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "compression/config_value.h"

namespace atl::outer {

namespace {

constexpr EnumName<LrDecay> kDecays[] = {{LrDecay::kConstant, "constant"},
                                         {LrDecay::kCosine, "cosine"}};

}  // namespace

absl::Status ParseConfigValue(const std::string& text, LrDecay* value) {
  return ParseEnumValue(text, kDecays, value);
}

std::string ConfigValueText(LrDecay value) { return EnumValueName(value, kDecays); }

absl::Status Validate(const OuterOptimizerConfig& c) {
  if (!(c.lr > 0) || !std::isfinite(c.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("outer.lr must be positive, got ", c.lr));
  }
  if (c.momentum_delay < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the outer momentum delay must be >= 0, got ", c.momentum_delay));
  }
  if (!(c.momentum >= 0 && c.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.momentum must be in [0, 1), got ", c.momentum));
  }
  if (c.warmup_rounds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.lr_warmup_rounds must be >= 0, got ", c.warmup_rounds));
  }
  if (!(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.min_lr_ratio must be in [0, 1], got ", c.min_lr_ratio));
  }
  return absl::OkStatus();
}

double ScheduledLr(const OuterOptimizerConfig& c, uint64_t round, uint64_t total_rounds) {
  const uint64_t warmup = uint64_t(c.warmup_rounds);
  if (round < warmup) return c.lr * double(round + 1) / double(warmup + 1);
  if (c.decay != LrDecay::kCosine || total_rounds <= warmup + 1) return c.lr;
  const double progress =
      std::min(1.0, double(round - warmup) / double(total_rounds - warmup - 1));
  const double cosine = 0.5 * (1 + std::cos(3.14159265358979323846 * progress));
  return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * cosine);
}

OuterOptimizer::OuterOptimizer(const OuterOptimizerConfig& config, size_t num_elements)
    : config_(config),
      size_(num_elements),
      momentum_(config.momentum > 0 ? num_elements : 0, 0.0f),
      buffer_(config.momentum > 0 && config.nesterov && config.momentum_delay > 0 ? num_elements
                                                                                  : 0,
              0.0f) {}

void OuterOptimizer::ComputeUpdate(const float* g, float* u) {
  Preview(g, u);
  Advance(g);
}

// Preview computes the new momentum in a register with the same float operations Advance stores,
// so that the update is bit for bit what a single in-place pass would produce.
void OuterOptimizer::Preview(const float* g, float* u) const { Preview(g, u, 0, size_); }

void OuterOptimizer::Preview(const float* g, float* u, size_t first, size_t n) const {
  const float lr = float(config_.lr), mu = float(config_.momentum);
  if (momentum_.empty() || averaging_) {
    for (size_t i = 0; i < n; ++i) u[i] = lr * g[i];
    return;
  }
  const float* m = momentum_.data() + first;
  if (!buffer_.empty()) {  // delayed Nesterov
    const float period = float(config_.momentum_delay);
    if (buffered_ + 1 < config_.momentum_delay) {
      for (size_t i = 0; i < n; ++i) u[i] = lr * (g[i] / period);
      return;
    }
    const float* b = buffer_.data() + first;
    for (size_t i = 0; i < n; ++i) {
      const float m_new = mu * m[i] + (b[i] + g[i]) / period;
      u[i] = lr * (g[i] / period + mu * m_new);
    }
    return;
  }
  if (config_.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float m_new = mu * m[i] + g[i];
      u[i] = lr * (g[i] + mu * m_new);
    }
  } else {
    for (size_t i = 0; i < n; ++i) u[i] = lr * (mu * m[i] + g[i]);
  }
}

void OuterOptimizer::Advance(const float* g) {
  Advance(g, 0, size_);
  EndStep();
}

void OuterOptimizer::Advance(const float* g, size_t first, size_t n) {
  if (momentum_.empty() || averaging_) return;
  const float mu = float(config_.momentum);
  float* m = momentum_.data() + first;
  if (!buffer_.empty()) {
    const float period = float(config_.momentum_delay);
    float* b = buffer_.data() + first;
    if (buffered_ + 1 < config_.momentum_delay) {
      for (size_t i = 0; i < n; ++i) b[i] += g[i];
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      m[i] = mu * m[i] + (b[i] + g[i]) / period;
      b[i] = 0.0f;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) m[i] = mu * m[i] + g[i];
}

void OuterOptimizer::EndStep() {
  if (buffer_.empty() || averaging_) return;
  if (++buffered_ >= config_.momentum_delay) buffered_ = 0;
}

absl::Status OuterOptimizer::Restore(std::vector<float> momentum, std::vector<float> buffer,
                                     int buffered) {
  if (momentum.size() != momentum_.size() || buffer.size() != buffer_.size() || buffered < 0 ||
      buffered >= std::max(1, config_.momentum_delay)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer optimizer state does not fit: momentum ", momentum.size(), " (expected ",
        momentum_.size(), "), buffer ", buffer.size(), " (expected ", buffer_.size(),
        "), buffered ", buffered));
  }
  momentum_ = std::move(momentum);
  buffer_ = std::move(buffer);
  buffered_ = buffered;
  return absl::OkStatus();
}

void ApplyUpdate(float* theta, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) theta[i] -= u[i];
}

}  // namespace atl::outer
