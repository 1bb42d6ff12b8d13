#include "inner/train_config.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"

namespace atl::inner {
namespace {

constexpr EnumName<MixedPrecision> kMixedPrecision[] = {{MixedPrecision::kNone, "none"},
                                                        {MixedPrecision::kBf16, "bf16"}};
constexpr EnumName<InnerOptimizerName> kInnerOptimizers[] = {{InnerOptimizerName::kAdamW, "adamw"},
                                                              {InnerOptimizerName::kMuon, "muon"}};
constexpr EnumName<ActivationCheckpointMode> kCheckpointModes[] = {
    {ActivationCheckpointMode::kNone, "none"}, {ActivationCheckpointMode::kFull, "full"}};

absl::Status Positive(const char* key, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be positive, got ", value));
}

absl::Status NonNegative(const char* key, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be >= 0, got ", value));
}

}  // namespace

absl::Status ParseConfigValue(const std::string& text, MixedPrecision* value) {
  return ParseEnumValue(text, kMixedPrecision, value);
}
std::string ConfigValueText(MixedPrecision value) { return EnumValueName(value, kMixedPrecision); }

absl::Status ParseConfigValue(const std::string& text, InnerOptimizerName* value) {
  return ParseEnumValue(text, kInnerOptimizers, value);
}
std::string ConfigValueText(InnerOptimizerName value) {
  return EnumValueName(value, kInnerOptimizers);
}

absl::Status ParseConfigValue(const std::string& text, ActivationCheckpointMode* value) {
  return ParseEnumValue(text, kCheckpointModes, value);
}
std::string ConfigValueText(ActivationCheckpointMode value) {
  return EnumValueName(value, kCheckpointModes);
}

absl::StatusOr<std::string> ResolveDevice(const std::string& device, int local_rank,
                                          bool cuda_available) {
  int index = -1;
  const bool cuda = device == "cuda" || (device.rfind("cuda:", 0) == 0 &&
                                         absl::SimpleAtoi(device.substr(5), &index) && index >= 0);
  if (device != "cpu" && device != "auto" && !cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.device must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got \"", device, "\"",
        DidYouMean(device, {"auto", "cpu", "cuda"})));
  }
  if (device == "cpu" || (device == "auto" && !cuda_available)) return std::string("cpu");
  if (!cuda_available) {
    return absl::FailedPreconditionError(
        absl::StrCat("train.device = \"", device, "\" but no CUDA device is available"));
  }
  return index >= 0 ? device : absl::StrCat("cuda:", local_rank);
}

absl::Status Validate(const TrainConfig& c) {
  ATL_RETURN_IF_ERROR(Positive("train.steps", c.steps));
  ATL_RETURN_IF_ERROR(Positive("train.batch_size", c.batch_size));
  ATL_RETURN_IF_ERROR(Positive("train.grad_accum", c.grad_accum));
  ATL_RETURN_IF_ERROR(NonNegative("train.eval_every", c.eval_every));
  ATL_RETURN_IF_ERROR(Positive("train.eval_batches", c.eval_batches));
  ATL_RETURN_IF_ERROR(NonNegative("train.threads", c.threads));
  // The device's name (whether a GPU asked for is there is known where a rank starts: the
  // trainer resolves it with CUDA as libtorch sees it).
  ATL_RETURN_IF_ERROR(ResolveDevice(c.device, 0, /*cuda_available=*/true).status());
  ATL_RETURN_IF_ERROR(Positive("train.log_every", c.log_every));
  ATL_RETURN_IF_ERROR(NonNegative("train.checkpoint_every", c.checkpoint_every));
  if (c.checkpoint_keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.checkpoint_keep must be at least 1, got ", c.checkpoint_keep));
  }
  return absl::OkStatus();
}

absl::Status Validate(const AdamWOptions& o) {
  if (!(o.beta1 >= 0 && o.beta1 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.beta1 must be in [0, 1), got ", o.beta1));
  }
  if (!(o.beta2 >= 0 && o.beta2 < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.beta2 must be in [0, 1), got ", o.beta2));
  }
  if (!(o.eps > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.eps must be positive, got ", o.eps));
  }
  if (!(o.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optim.weight_decay must be non-negative, got ", o.weight_decay));
  }
  return absl::OkStatus();
}

absl::Status Validate(const OptimConfig& c, const TrainConfig& train) {
  if (!(c.lr > 0) || !std::isfinite(c.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.lr must be positive, got ", c.lr));
  }
  if (!(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optim.min_lr_ratio must be in [0, 1], got ", c.min_lr_ratio));
  }
  if (c.warmup_steps < 0 || c.warmup_steps > train.steps) {
    return absl::InvalidArgumentError(absl::StrCat("optim.warmup_steps must be in [0, train.steps = ",
                                                   train.steps, "], got ", c.warmup_steps));
  }
  if (!(c.grad_clip >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("optim.grad_clip must be >= 0, got ", c.grad_clip));
  }
  if (!(c.muon.momentum >= 0 && c.muon.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optim.muon_momentum must be in [0, 1), got ", c.muon.momentum));
  }
  if (c.muon.ns_steps < 1 || c.muon.ns_steps > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("optim.muon_ns_steps must be in [1, 20], got ", c.muon.ns_steps));
  }
  return Validate(c.adamw);
}

}  // namespace atl::inner
