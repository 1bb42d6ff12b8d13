// Internal to the CUDA sources: the smallest index a kernel reports with atomicMin, read back.
#ifndef ATOLL_COMPRESSION_CODEC_CUDA_MIN_CUH_
#define ATOLL_COMPRESSION_CODEC_CUDA_MIN_CUH_

#include <cuda_runtime.h>

#include <cstddef>

namespace atl::compression::cuda::detail {

// *found = the smallest value `launch(d)` atomicMin-ed into *d on stream s, or `none` when it
// wrote nothing. `launch` queues its kernels and returns a cudaError_t value. Synchronizes s.
template <class Launch>
int DeviceMin(cudaStream_t s, size_t none, size_t* found, Launch launch) {
  *found = none;
  unsigned long long* d = nullptr;
  unsigned long long h = ~0ull;
  cudaError_t err = cudaMallocAsync(&d, sizeof(*d), s);
  if (err != cudaSuccess) return int(err);
  cudaMemcpyAsync(d, &h, sizeof(h), cudaMemcpyHostToDevice, s);
  const int launched = launch(d);
  cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, s);
  cudaFreeAsync(d, s);
  err = cudaStreamSynchronize(s);
  if (launched != 0) return launched;
  if (err == cudaSuccess) err = cudaGetLastError();
  if (h != ~0ull) *found = size_t(h);
  return int(err);
}

}  // namespace atl::compression::cuda::detail

#endif  // ATOLL_COMPRESSION_CODEC_CUDA_MIN_CUH_
