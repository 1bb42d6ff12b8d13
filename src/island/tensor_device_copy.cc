#include "src/island/tensor_device_copy.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/status_macros.h"

namespace atl {

absl::StatusOr<std::unique_ptr<TensorDeviceCopy>> TensorDeviceCopy::Create(
    Parts parts, uint64_t elements, const at::Device& where) {
  // "cuda" without an index: the device the parameters are on.
  const std::vector<at::Tensor> pieces = parts();
  const bool any_index = !where.has_index() && !pieces.empty() &&
                        pieces.front().device().type() == where.type();
  const at::Device device = any_index ? pieces.front().device() : where;
  std::unique_ptr<compression::SpanEngine> engine;
  if (device.is_cuda()) {
    auto cuda = compression::SpanEngine::Cuda(device.has_index() ? device.index() : -1);
    if (!cuda.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("outer.global_copy = \"device\" on ", device.str(), ": ",
                       cuda.status().message()));
    }
    engine = *std::move(cuda);
  } else if (device.is_cpu()) {
    engine = compression::SpanEngine::Host();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("outer.global_copy = \"device\" does not support ", device.str()));
  }
  uint64_t total = 0;
  for (const auto& p : pieces) {
    if (p.dim() != 1 || !p.is_contiguous() || p.scalar_type() != at::kFloat || p.device() != device) {
      return absl::InvalidArgumentError("a device copy needs 1-D contiguous fp32 parameter pieces");
    }
    total += uint64_t(p.numel());
  }
  if (total != elements) {
    return absl::InvalidArgumentError(absl::StrCat("the parameter pieces hold ", total,
                                                   " elements, the fragment's ranges ", elements));
  }
  return std::unique_ptr<TensorDeviceCopy>(
      new TensorDeviceCopy(std::move(parts), elements, std::move(engine), device));
}

TensorDeviceCopy::TensorDeviceCopy(Parts parts, uint64_t n,
                                   std::unique_ptr<compression::SpanEngine> engine,
                                   const at::Device& device)
    : parts_(std::move(parts)),
      n_(n),
      engine_(std::move(engine)),
      options_(at::TensorOptions().dtype(at::kFloat).device(device)) {
  global_ = at::zeros({int64_t(n_)}, options_);
  delta_ = at::empty({int64_t(n_)}, options_);
}

absl::Status TensorDeviceCopy::Load(const std::vector<float>& global) {
  if (global.size() != n_) {
    return absl::InvalidArgumentError(
        absl::StrCat("device copy of ", n_, " elements loaded with ", global.size()));
  }
  // After whatever the compute stream still has queued (a merge reading the copy).
  ATL_RETURN_IF_ERROR(engine_->MarkCompute());
  return engine_->FromHost(global_.data_ptr<float>(), global.data(), n_ * sizeof(float));
}

absl::Status TensorDeviceCopy::Capture(bool error_feedback, float decay) {
  torch::NoGradGuard no_grad;
  if (error_feedback) AllocateResidual();
  const bool add_residual = error_feedback && residual_valid_;
  int64_t at = 0;
  for (const auto& p : parts_()) {
    const int64_t k = p.numel();
    at::Tensor d = delta_.narrow(0, at, k);
    // The host path's arithmetic: (global - local) + decay x residual, each rounded once (the
    // product apart, so that no fused multiply-add rounds differently).
    at::sub_out(d, global_.narrow(0, at, k), p);
    if (add_residual && decay == 1.0f) d.add_(residual_.narrow(0, at, k));
    if (add_residual && decay != 1.0f) d.add_(residual_.narrow(0, at, k) * decay);
    at += k;
  }
  // The engine's work on this pseudo-gradient waits for these ops, not the training thread.
  return engine_->MarkCompute();
}

void TensorDeviceCopy::Reserve(size_t bytes, uint64_t n) {
  if (!bytes_.defined() || size_t(bytes_.numel()) < bytes) {
    bytes_ = at::empty({int64_t(std::max<size_t>(1, bytes))}, options_.dtype(at::kByte));
  }
  if (!decoded_.defined() || uint64_t(decoded_.numel()) < n) {
    decoded_ = at::empty({int64_t(std::max<uint64_t>(1, n))}, options_);
  }
}

absl::Status TensorDeviceCopy::Encode(const compression::CodecSpec& spec, uint64_t at, uint64_t n,
                                      const compression::Rounding& rounding, uint8_t* out,
                                      float* exact, uint64_t sample) {
  if (at + n > n_) return absl::OutOfRangeError("chunk outside the device copy");
  const size_t bytes = compression::EncodedBytes(spec, n);
  const bool feedback = residual_.defined();
  Reserve(bytes, feedback ? n : 0);
  uint8_t* encoded = bytes_.data_ptr<uint8_t>();
  ATL_RETURN_IF_ERROR(engine_->Encode(spec, At(delta_, at), n, encoded, rounding));
  ATL_RETURN_IF_ERROR(engine_->ToHost(out, encoded, bytes));
  ATL_RETURN_IF_ERROR(engine_->ToHost(exact, At(delta_, at), std::min(n, sample) * sizeof(float)));
  if (!feedback) return absl::OkStatus();
  // What the service will not see: the pseudo-gradient minus its decoded encoding.
  ATL_RETURN_IF_ERROR(engine_->Decode(spec, encoded, bytes, n, decoded_.data_ptr<float>()));
  return engine_->Subtract(At(delta_, at), decoded_.data_ptr<float>(), At(next_residual_, at), n);
}

void TensorDeviceCopy::AllocateResidual() {
  if (residual_.defined()) return;
  std::lock_guard<std::mutex> lock(residual_mu_);
  residual_ = at::zeros({int64_t(n_)}, options_);
  next_residual_ = at::zeros({int64_t(n_)}, options_);
}

void TensorDeviceCopy::KeepResidual() {
  if (!residual_.defined()) return;
  std::lock_guard<std::mutex> lock(residual_mu_);
  std::swap(residual_, next_residual_);
  residual_valid_ = true;
}

void TensorDeviceCopy::ResetResidual() {
  std::lock_guard<std::mutex> lock(residual_mu_);
  residual_valid_ = false;
}

std::vector<float> TensorDeviceCopy::ResidualSnapshot() const {
  std::vector<float> out(n_, 0.0f);
  std::lock_guard<std::mutex> lock(residual_mu_);
  if (!residual_valid_ || n_ == 0) return out;
  // A libtorch copy on the calling thread's stream: the engine wrote the residual before its
  // Subtract returned, and KeepResidual swapped it in after.
  at::from_blob(out.data(), {int64_t(n_)}, at::kFloat).copy_(residual_);
  return out;
}

absl::Status TensorDeviceCopy::RestoreResidual(const std::vector<float>& residual) {
  if (residual.size() != n_) {
    return absl::InvalidArgumentError(absl::StrCat("a residual of ", residual.size(),
                                                   " elements for a device copy of ", n_));
  }
  AllocateResidual();
  std::lock_guard<std::mutex> lock(residual_mu_);
  ATL_RETURN_IF_ERROR(engine_->MarkCompute());
  ATL_RETURN_IF_ERROR(engine_->FromHost(residual_.data_ptr<float>(), residual.data(),
                                        n_ * sizeof(float)));
  residual_valid_ = true;
  return absl::OkStatus();
}

absl::Status TensorDeviceCopy::Apply(const compression::CodecSpec& spec, uint64_t at, uint64_t n,
                                     const std::string& bytes) {
  if (at + n > n_) return absl::OutOfRangeError("update chunk outside the device copy");
  Reserve(bytes.size(), n);
  uint8_t* encoded = bytes_.data_ptr<uint8_t>();
  float* decoded = decoded_.data_ptr<float>();
  ATL_RETURN_IF_ERROR(engine_->FromHost(encoded, bytes.data(), bytes.size()));
  ATL_RETURN_IF_ERROR(engine_->Decode(spec, encoded, bytes.size(), n, decoded));
  // outer::ApplyUpdate's arithmetic: global -= update.
  return engine_->Subtract(At(global_, at), decoded, At(global_, at), n);
}

void TensorDeviceCopy::MergeInto(double alpha) {
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (auto p : parts_()) {
    const int64_t k = p.numel();
    const at::Tensor src = global_.narrow(0, at, k);
    // The host path's arithmetic (ShardModel::Merge), so both give the same bits.
    if (alpha == 0.0) {
      p.copy_(src);
    } else {
      p.mul_(alpha).add_(src, 1.0 - alpha);
    }
    at += k;
  }
}

}  // namespace atl
