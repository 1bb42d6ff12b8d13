#include "compression/codec_cuda.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#if ATOLL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "compression/codec_cuda_launch.h"
#endif

namespace atl::compression::cuda {

#if ATOLL_HAVE_CUDA
namespace {

absl::Status CudaError(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", err, " (", cudaGetErrorString(cudaError_t(err)), ")"));
}

// Device memory that frees itself.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(T)) == cudaSuccess) ptr_ = static_cast<T*>(p);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

}  // namespace

bool Available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why) {
      *why = err != cudaSuccess ? absl::StrCat("no CUDA device (", cudaGetErrorString(err), ")")
                                : "no CUDA device";
    }
    cudaGetLastError();  // clear the sticky error of a failed probe
    return false;
  }
  return true;
}

absl::Status EncodeOnDevice(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                            const Rounding& rounding, void* stream) {
  size_t bad = n;
  if (auto s = CudaError(detail::FirstNonFinite(in, n, &bad, stream), "finite check"); !s.ok()) {
    return s;
  }
  if (bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("non-finite value at element ", bad, " refused before encoding"));
  }
  if (auto s = CudaError(detail::LaunchEncode(spec, in, n, out, rounding, stream), "encode");
      !s.ok()) {
    return s;
  }
  return CudaError(int(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))), "encode");
}

absl::Status DecodeOnDevice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                            float* out, void* stream) {
  if (bytes != EncodedBytes(spec, n)) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(spec.codec), " payload of ", n,
                                                   " elements must be ", EncodedBytes(spec, n),
                                                   " bytes, got ", bytes));
  }
  if (auto s = CudaError(detail::LaunchDecode(spec, in, n, out, stream), "decode"); !s.ok()) {
    return s;
  }
  size_t bad = n;
  if (auto s = CudaError(detail::FirstNonFinite(out, n, &bad, stream), "finite check"); !s.ok()) {
    return s;
  }
  if (bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload decodes to a non-finite value at element ", bad));
  }
  return absl::OkStatus();
}

absl::Status EncodeViaDevice(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                             const Rounding& rounding) {
  const size_t bytes = EncodedBytes(spec, n);
  DeviceBuffer<float> d_in(n);
  DeviceBuffer<uint8_t> d_out(bytes);
  if (!d_in.get() || !d_out.get()) return absl::ResourceExhaustedError("cudaMalloc failed");
  if (auto s = CudaError(int(cudaMemcpy(d_in.get(), in, n * 4, cudaMemcpyHostToDevice)), "copy in");
      !s.ok()) {
    return s;
  }
  if (auto s = EncodeOnDevice(spec, d_in.get(), n, d_out.get(), rounding); !s.ok()) return s;
  return CudaError(int(cudaMemcpy(out, d_out.get(), bytes, cudaMemcpyDeviceToHost)), "copy out");
}

absl::Status DecodeViaDevice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                             float* out) {
  DeviceBuffer<uint8_t> d_in(bytes);
  DeviceBuffer<float> d_out(n);
  if (!d_in.get() || !d_out.get()) return absl::ResourceExhaustedError("cudaMalloc failed");
  if (auto s = CudaError(int(cudaMemcpy(d_in.get(), in, bytes, cudaMemcpyHostToDevice)), "copy in");
      !s.ok()) {
    return s;
  }
  if (auto s = DecodeOnDevice(spec, d_in.get(), bytes, n, d_out.get()); !s.ok()) return s;
  return CudaError(int(cudaMemcpy(out, d_out.get(), n * 4, cudaMemcpyDeviceToHost)), "copy out");
}

#else  // !ATOLL_HAVE_CUDA

namespace {
absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "this build has no CUDA kernels (configure with nvcc available and ATOLL_CUDA=AUTO or ON)");
}
}  // namespace

bool Available(std::string* why) {
  if (why) *why = "this build has no CUDA kernels (ATOLL_CUDA=OFF or nvcc not found)";
  return false;
}
absl::Status EncodeOnDevice(const CodecSpec&, const float*, size_t, uint8_t*, const Rounding&,
                            void*) {
  return NotBuilt();
}
absl::Status DecodeOnDevice(const CodecSpec&, const uint8_t*, size_t, size_t, float*, void*) {
  return NotBuilt();
}
absl::Status EncodeViaDevice(const CodecSpec&, const float*, size_t, uint8_t*, const Rounding&) {
  return NotBuilt();
}
absl::Status DecodeViaDevice(const CodecSpec&, const uint8_t*, size_t, size_t, float*) {
  return NotBuilt();
}

#endif  // ATOLL_HAVE_CUDA

}  // namespace atl::compression::cuda
