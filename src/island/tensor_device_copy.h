// outer::DeviceCopy over libtorch tensors on the parameters' device: the global copy, the captured
// pseudo-gradient and the error-feedback residuals are fp32 tensors there; the codecs run through
// a compression::SpanEngine (the CUDA kernels on a stream of their own, or the host's codecs for
// parameters on the CPU, which makes this path testable without a GPU and bit for bit the same).
//
// Capture and MergeInto are libtorch ops on the training thread, in the compute stream's order;
// the engine's work (encode, copy the encoded bytes out, decode and apply updates) waits for the
// capture through an event and runs on the engine's stream, so training goes on meanwhile.
// Device memory: 2 x 4 bytes per owned parameter (copy and pseudo-gradient), 2 x 4 more with error
// feedback, plus one chunk of scratch (outer.global_copy = "host" spends none of it).
#ifndef ATOLL_SRC_ISLAND_TENSOR_DEVICE_COPY_H_
#define ATOLL_SRC_ISLAND_TENSOR_DEVICE_COPY_H_

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/span_engine.h"
#include "outer/island/device_copy.h"

namespace atl {

class TensorDeviceCopy : public outer::DeviceCopy {
 public:
  // The model's pieces of the fragment this rank owns, in owned order: 1-D contiguous fp32 views
  // of its parameter shards, on one device. Asked for at every use (the views are cheap and the
  // trainer's storage may change between rounds). `device` may name no index ("cuda"): the pieces'.
  using Parts = std::function<std::vector<at::Tensor>()>;
  static absl::StatusOr<std::unique_ptr<TensorDeviceCopy>> Create(Parts parts, uint64_t elements,
                                                                  const at::Device& device);

  uint64_t size() const override { return n_; }
  absl::Status Load(const std::vector<float>& global) override;
  absl::Status Capture(bool error_feedback, float decay = 1.0f) override;
  absl::Status Encode(const compression::CodecSpec& spec, uint64_t at, uint64_t n,
                      const compression::Rounding& rounding, uint8_t* out, float* exact,
                      uint64_t sample) override;
  void KeepResidual() override;
  void ResetResidual() override;
  std::vector<float> ResidualSnapshot() const override;
  absl::Status RestoreResidual(const std::vector<float>& residual) override;
  absl::Status Apply(const compression::CodecSpec& spec, uint64_t at, uint64_t n,
                     const std::string& bytes) override;

  // The training thread: every part = alpha * part + (1 - alpha) * global (alpha 0: a copy).
  void MergeInto(double alpha);
  // The copy itself (for tests and checks).
  const at::Tensor& global() const { return global_; }
  bool on_device() const { return engine_->on_device(); }

 private:
  TensorDeviceCopy(Parts parts, uint64_t n, std::unique_ptr<compression::SpanEngine> engine,
                   const at::Device& device);
  float* At(const at::Tensor& t, uint64_t at) const { return t.data_ptr<float>() + at; }
  // Scratch of at least `bytes` bytes (encoded) and `n` floats (decoded), grown as needed.
  void Reserve(size_t bytes, uint64_t n);

  Parts parts_;
  uint64_t n_;
  std::unique_ptr<compression::SpanEngine> engine_;
  at::TensorOptions options_;
  at::Tensor global_, delta_;
  // Make the residuals (with error feedback) before first use.
  void AllocateResidual();

  mutable std::mutex residual_mu_;       // guards residual_ and residual_valid_ against snapshots
  at::Tensor residual_, next_residual_;  // with error feedback
  bool residual_valid_ = false;          // false: the residual is zero
  at::Tensor bytes_, decoded_;           // scratch for one chunk
};

}  // namespace atl

#endif  // ATOLL_SRC_ISLAND_TENSOR_DEVICE_COPY_H_
