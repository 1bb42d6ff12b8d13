#include "inner/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include <string>

#include "inner/build_info.h"
#ifdef ATOLL_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace atl::inner::compat {

at::Generator MakeCpuGenerator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

#ifdef ATOLL_TORCH_CUDA
ThrowOnDeviceSync::ThrowOnDeviceSync() {
  auto& state = c10::cuda::warning_state();
  was_ = int(state.get_sync_debug_mode());
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
}
ThrowOnDeviceSync::~ThrowOnDeviceSync() {
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode(was_));
}
bool ThrowOnDeviceSync::active() { return true; }
#else
ThrowOnDeviceSync::ThrowOnDeviceSync() = default;
ThrowOnDeviceSync::~ThrowOnDeviceSync() = default;
bool ThrowOnDeviceSync::active() { return false; }
#endif

at::Tensor GetDefaultCpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  return gen.get_state();
}

void SetDefaultCpuRngState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(state);
}

namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool AutocastEnabled(bool cuda) { return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU); }
void SetAutocast(bool cuda, bool enabled, at::ScalarType dtype) {
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, enabled);
  at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, dtype);
}
at::ScalarType AutocastDtype(bool cuda) {
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
}
#else
bool AutocastEnabled(bool cuda) {
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void SetAutocast(bool cuda, bool enabled, at::ScalarType dtype) {
  if (cuda) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
at::ScalarType AutocastDtype(bool cuda) {
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
#endif

}  // namespace

AutocastBf16::AutocastBf16(bool enabled, bool cuda) : enabled_(enabled), cuda_(cuda) {
  if (!enabled_) return;
  was_enabled_ = AutocastEnabled(cuda_);
  was_dtype_ = AutocastDtype(cuda_);
  SetAutocast(cuda_, true, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastBf16::~AutocastBf16() {
  if (!enabled_) return;
  // The casts of the weights are cached while autocast is on: dropped with the outermost guard.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocast(cuda_, was_enabled_, was_dtype_);
}

void ResizeStorage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace atl::inner::compat

namespace atl::inner {

std::string TorchVersion() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool TorchCudaBuild() {
#ifdef ATOLL_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() { return torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0; }

}  // namespace atl::inner
