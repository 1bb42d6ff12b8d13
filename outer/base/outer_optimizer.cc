#include "outer/base/outer_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  const auto names = OuterOptimizerNames();
  if (std::find(names.begin(), names.end(), c.name) == names.end()) {
    return absl::InvalidArgumentError(absl::StrCat("outer.optimizer must be one of ",
                                                   absl::StrJoin(names, ", "), ", got \"",
                                                   c.name, "\""));
  }
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

void OuterOptimizer::ComputeUpdate(const float* g, float* u) {
  Preview(g, u, 0, size_);
  Advance(g, 0, size_);
  EndStep();
}

namespace {

// u = lr x g: no state.
class SgdOptimizer : public OuterOptimizer {
 public:
  SgdOptimizer(const OuterOptimizerConfig& config, size_t n) : OuterOptimizer(config.lr, n) {}
  const char* name() const override { return "sgd"; }
  void Preview(const float* g, float* u, size_t, size_t count) const override {
    LinearStep(float(lr_), g, u, count);
  }
  bool linear() const override { return true; }
  void Advance(const float*, size_t, size_t) override {}
  void EndStep() override {}
  std::vector<Tensor> StateTensors() const override { return {}; }
  absl::Status Restore(std::vector<std::pair<std::string, std::vector<float>>> tensors,
                       const std::vector<std::pair<std::string, int64_t>>& counters) override {
    if (!tensors.empty() || !counters.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the sgd outer optimizer keeps no state, got ",
          tensors.empty() ? counters.front().first : tensors.front().first));
    }
    return absl::OkStatus();
  }
  std::unique_ptr<OuterOptimizer> Clone() const override {
    return std::make_unique<SgdOptimizer>(*this);
  }
  void Restart() override {}
};

struct OptimizerKind {
  const char* name;
  std::unique_ptr<OuterOptimizer> (*make)(const OuterOptimizerConfig&, size_t);
  OuterOptimizerTraits traits;
};

const OptimizerKind kOptimizers[] = {
    {.name = "nesterov",
     .make = [](const OuterOptimizerConfig& c, size_t n) -> std::unique_ptr<OuterOptimizer> {
       return std::make_unique<NesterovOptimizer>(c, n);
     },
     .traits = {.linear = [](const OuterOptimizerConfig& c) { return c.momentum == 0; },
                // u = lr (g + mu m'), m' = mu m + g: du/dg = lr (1 + mu); heavy ball: u = lr m'.
                .gain = [](const OuterOptimizerConfig& c) {
                  return c.nesterov ? c.lr * (1.0 + c.momentum) : c.lr;
                }}},
    {.name = "sgd",
     .make = [](const OuterOptimizerConfig& c, size_t n) -> std::unique_ptr<OuterOptimizer> {
       return std::make_unique<SgdOptimizer>(c, n);
     },
     .traits = {.linear = [](const OuterOptimizerConfig&) { return true; },
                .gain = [](const OuterOptimizerConfig& c) { return c.lr; }}},
};

const OptimizerKind& KindOf(const OuterOptimizerConfig& config) {
  for (const auto& k : kOptimizers) {
    if (config.name == k.name) return k;
  }
  return kOptimizers[0];  // Validate refuses unknown names first
}

// The state a Restore was given, by name: each must be found once.
template <class T>
T* Take(std::vector<std::pair<std::string, T>>& items, const std::string& name) {
  for (auto& [n, v] : items) {
    if (n == name) return &v;
  }
  return nullptr;
}

template <class T>
const T* Take(const std::vector<std::pair<std::string, T>>& items, const std::string& name) {
  for (const auto& [n, v] : items) {
    if (n == name) return &v;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> OuterOptimizerNames() {
  std::vector<std::string> names;
  for (const auto& k : kOptimizers) names.push_back(k.name);
  return names;
}

std::unique_ptr<OuterOptimizer> MakeOuterOptimizer(const OuterOptimizerConfig& config,
                                                   size_t num_elements) {
  return KindOf(config).make(config, num_elements);
}

const OuterOptimizerTraits& TraitsOf(const OuterOptimizerConfig& config) {
  return KindOf(config).traits;
}

NesterovOptimizer::NesterovOptimizer(const OuterOptimizerConfig& config, size_t num_elements)
    : OuterOptimizer(config.lr, num_elements),
      config_(config),
      momentum_(config.momentum > 0 ? num_elements : 0, 0.0f),
      buffer_(config.momentum > 0 && config.nesterov && config.momentum_delay > 0 ? num_elements
                                                                                  : 0,
              0.0f) {}

// Preview computes the new momentum in a register with the same float operations Advance stores,
// so that the update is bit for bit what a single in-place pass would produce.
void NesterovOptimizer::Preview(const float* g, float* u, size_t first, size_t n) const {
  const float lr = float(lr_), mu = float(config_.momentum);
  if (momentum_.empty() || averaging_) {
    LinearStep(lr, g, u, n);
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

void NesterovOptimizer::Advance(const float* g, size_t first, size_t n) {
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

void NesterovOptimizer::EndStep() {
  if (buffer_.empty() || averaging_) return;
  if (++buffered_ >= config_.momentum_delay) buffered_ = 0;
}

std::vector<OuterOptimizer::Tensor> NesterovOptimizer::StateTensors() const {
  std::vector<Tensor> out;
  if (!momentum_.empty()) out.push_back({"momentum", &momentum_});
  if (!buffer_.empty()) out.push_back({"buffer", &buffer_});
  return out;
}

std::vector<std::pair<std::string, int64_t>> NesterovOptimizer::StateCounters() const {
  if (buffer_.empty()) return {};
  return {{"buffered", buffered_}};
}

void NesterovOptimizer::Restart() {
  std::fill(momentum_.begin(), momentum_.end(), 0.0f);
  std::fill(buffer_.begin(), buffer_.end(), 0.0f);
  buffered_ = 0;
}

absl::Status NesterovOptimizer::Restore(
    std::vector<std::pair<std::string, std::vector<float>>> tensors,
    const std::vector<std::pair<std::string, int64_t>>& counters) {
  const size_t expected_tensors = (momentum_.empty() ? 0 : 1) + (buffer_.empty() ? 0 : 1);
  std::vector<float>* momentum = Take(tensors, "momentum");
  std::vector<float>* buffer = Take(tensors, "buffer");
  const int64_t* buffered = Take(counters, "buffered");
  const int64_t count = buffered == nullptr ? 0 : *buffered;
  const bool fits =
      tensors.size() == expected_tensors && counters.size() == (buffer_.empty() ? 0u : 1u) &&
      (momentum_.empty() || (momentum && momentum->size() == momentum_.size())) &&
      (buffer_.empty() || (buffer && buffer->size() == buffer_.size() && buffered)) && count >= 0 &&
      count < std::max(1, config_.momentum_delay);
  if (!fits) {
    std::string got;
    for (const auto& [name, values] : tensors) absl::StrAppend(&got, " ", name, "[", values.size(), "]");
    for (const auto& [name, value] : counters) absl::StrAppend(&got, " ", name, "=", value);
    return absl::InvalidArgumentError(absl::StrCat(
        "outer optimizer state does not fit: expected momentum[", momentum_.size(), "]",
        buffer_.empty() ? "" : absl::StrCat(", buffer[", buffer_.size(), "], buffered"), ", got",
        got.empty() ? " nothing" : got));
  }
  if (momentum != nullptr) momentum_ = std::move(*momentum);
  if (buffer != nullptr) buffer_ = std::move(*buffer);
  buffered_ = int(count);
  return absl::OkStatus();
}

void ApplyUpdate(float* theta, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) theta[i] -= u[i];
}

void LinearStep(float lr, const float* g, float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) u[i] = lr * g[i];
}

}  // namespace atl::outer
