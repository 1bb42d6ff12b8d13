#include "compression/codec_cuda.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "compression/span_engine.h"

#include "absl/strings/str_cat.h"

#if ATOLL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "compression/codec_cuda_launch.h"
#include "compression/codec_sparse.h"
#include "compression/status_macros.h"
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

bool Supports(Codec codec) { return detail::HasKernels(codec); }

bool Supports(const CodecSpec& spec) {
  if (!spec.sparse()) return detail::HasKernels(spec.codec);
  return detail::HasSparseKernels(spec.codec) && spec.block_size <= sparse::kMaxChunk;
}

namespace {

absl::Status CheckKernels(const CodecSpec& spec) {
  if (Supports(spec)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(SpecText(spec), " has no CUDA kernels: it is encoded on the host"));
}

sparse::ValueLayout ValuesOf(const CodecSpec& spec) {
  return sparse::ValueLayoutOf(*FindCodec(spec.codec));
}

int Launch(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
           const Rounding& rounding, void* stream) {
  if (!spec.sparse()) return detail::LaunchEncode(spec, in, n, out, rounding, stream);
  return detail::LaunchSparseEncode(spec, ValuesOf(spec), sparse::ChunkBytes(spec, spec.block_size),
                                    in, n, out, rounding, stream);
}

// A sparse payload the kernels refused: the CPU decoder names the problem in its words.
absl::Status RefusedSparse(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                           size_t chunk, void* stream) {
  std::vector<uint8_t> host(bytes);
  std::vector<float> scratch(n);
  ATL_RETURN_IF_ERROR(CudaError(
      int(cudaMemcpyAsync(host.data(), in, bytes, cudaMemcpyDeviceToHost,
                          static_cast<cudaStream_t>(stream))),
      "copy a refused payload"));
  ATL_RETURN_IF_ERROR(
      CudaError(int(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))), "copy"));
  const absl::Status cpu = Decode(spec, host.data(), bytes, n, scratch.data());
  if (!cpu.ok()) return cpu;
  return absl::InternalError(absl::StrCat("the CUDA decoder refused sparse chunk ", chunk,
                                          ", which the CPU decoder accepts"));
}

}  // namespace

absl::Status EncodeOnDevice(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                            const Rounding& rounding, void* stream) {
  ATL_RETURN_IF_ERROR(CheckKernels(spec));
  size_t bad = n;
  ATL_RETURN_IF_ERROR(CudaError(detail::FirstNonFinite(in, n, &bad, stream), "finite check"));
  if (bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("non-finite value at element ", bad, " refused before encoding"));
  }
  ATL_RETURN_IF_ERROR(CudaError(Launch(spec, in, n, out, rounding, stream), "encode"));
  return CudaError(int(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))), "encode");
}

absl::Status DecodeOnDevice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                            float* out, void* stream) {
  ATL_RETURN_IF_ERROR(CheckKernels(spec));
  if (bytes != EncodedBytes(spec, n)) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(spec.codec), " payload of ", n,
                                                   " elements must be ", EncodedBytes(spec, n),
                                                   " bytes, got ", bytes));
  }
  if (spec.sparse()) {
    size_t bad_chunk = SIZE_MAX;
    ATL_RETURN_IF_ERROR(CudaError(
        detail::LaunchSparseDecode(spec, ValuesOf(spec), sparse::ChunkBytes(spec, spec.block_size),
                                   in, n, out, &bad_chunk, stream),
        "decode"));
    if (bad_chunk != SIZE_MAX) return RefusedSparse(spec, in, bytes, n, bad_chunk, stream);
  } else {
    ATL_RETURN_IF_ERROR(CudaError(detail::LaunchDecode(spec, in, n, out, stream), "decode"));
  }
  size_t bad = n;
  ATL_RETURN_IF_ERROR(CudaError(detail::FirstNonFinite(out, n, &bad, stream), "finite check"));
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
  ATL_RETURN_IF_ERROR(
      CudaError(int(cudaMemcpy(d_in.get(), in, n * 4, cudaMemcpyHostToDevice)), "copy in"));
  ATL_RETURN_IF_ERROR(EncodeOnDevice(spec, d_in.get(), n, d_out.get(), rounding));
  return CudaError(int(cudaMemcpy(out, d_out.get(), bytes, cudaMemcpyDeviceToHost)), "copy out");
}

absl::Status DecodeViaDevice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                             float* out) {
  DeviceBuffer<uint8_t> d_in(bytes);
  DeviceBuffer<float> d_out(n);
  if (!d_in.get() || !d_out.get()) return absl::ResourceExhaustedError("cudaMalloc failed");
  ATL_RETURN_IF_ERROR(
      CudaError(int(cudaMemcpy(d_in.get(), in, bytes, cudaMemcpyHostToDevice)), "copy in"));
  ATL_RETURN_IF_ERROR(DecodeOnDevice(spec, d_in.get(), bytes, n, d_out.get()));
  return CudaError(int(cudaMemcpy(out, d_out.get(), n * 4, cudaMemcpyDeviceToHost)), "copy out");
}

}  // namespace atl::compression::cuda

namespace atl::compression {
namespace {

using cuda::CudaError;

// The CUDA engine: its own non-blocking stream (it never waits for the compute stream, nor the
// compute stream for it, except through MarkCompute's event), pinned staging for host copies.
class CudaEngine : public SpanEngine {
 public:
  static constexpr size_t kStagingBytes = size_t(16) << 20;

  explicit CudaEngine(int device) : device_(device) {}
  ~CudaEngine() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamDestroy(stream_);
    if (compute_) cudaEventDestroy(compute_);
    if (staging_) cudaFreeHost(staging_);
  }
  absl::Status Init() {
    ATL_RETURN_IF_ERROR(CudaError(int(cudaSetDevice(device_)), "set device"));
    ATL_RETURN_IF_ERROR(
        CudaError(int(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)), "stream"));
    ATL_RETURN_IF_ERROR(
        CudaError(int(cudaEventCreateWithFlags(&compute_, cudaEventDisableTiming)), "event"));
    return CudaError(int(cudaHostAlloc(&staging_, kStagingBytes, cudaHostAllocDefault)), "pinned memory");
  }

  bool on_device() const override { return true; }
  absl::Status MarkCompute() override {
    ATL_RETURN_IF_ERROR(CudaError(int(cudaSetDevice(device_)), "set device"));
    marked_ = true;
    // The legacy default stream: libtorch's default (compute) stream.
    return CudaError(int(cudaEventRecord(compute_, nullptr)), "record the compute stream");
  }
  absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                      const Rounding& rounding) override {
    ATL_RETURN_IF_ERROR(Begin());
    return cuda::EncodeOnDevice(spec, in, n, out, rounding, stream_);
  }
  absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                      float* out) override {
    ATL_RETURN_IF_ERROR(Begin());
    return cuda::DecodeOnDevice(spec, in, bytes, n, out, stream_);
  }
  absl::Status Subtract(const float* a, const float* b, float* out, size_t n) override {
    ATL_RETURN_IF_ERROR(Begin());
    ATL_RETURN_IF_ERROR(CudaError(cuda::detail::LaunchSubtract(a, b, out, n, stream_), "subtract"));
    return CudaError(int(cudaStreamSynchronize(stream_)), "subtract");
  }
  absl::Status ToHost(void* host, const void* dev, size_t bytes) override {
    return Staged(bytes, "copy to the host", [&](size_t at, size_t k) {
      return cudaMemcpyAsync(staging_, static_cast<const char*>(dev) + at, k,
                             cudaMemcpyDeviceToHost, stream_);
    }, [&](size_t at, size_t k) { std::memcpy(static_cast<char*>(host) + at, staging_, k); });
  }
  absl::Status FromHost(void* dev, const void* host, size_t bytes) override {
    return Staged(bytes, "copy to the device", [&](size_t at, size_t k) {
      std::memcpy(staging_, static_cast<const char*>(host) + at, k);
      return cudaMemcpyAsync(static_cast<char*>(dev) + at, staging_, k, cudaMemcpyHostToDevice,
                             stream_);
    }, [](size_t, size_t) {});
  }

 private:
  // A copy through the pinned staging buffer, piece by piece: `copy` queues piece [at, at + k) on
  // the stream, which is then waited for (the buffer is reused) before `after` runs.
  template <typename Copy, typename After>
  absl::Status Staged(size_t bytes, const char* what, Copy copy, After after) {
    ATL_RETURN_IF_ERROR(Begin());
    for (size_t at = 0; at < bytes; at += kStagingBytes) {
      const size_t k = std::min(kStagingBytes, bytes - at);
      ATL_RETURN_IF_ERROR(CudaError(int(copy(at, k)), what));
      ATL_RETURN_IF_ERROR(CudaError(int(cudaStreamSynchronize(stream_)), what));
      after(at, k);
    }
    return absl::OkStatus();
  }
  // Every call: on the engine's device, after the compute stream's work as last marked.
  absl::Status Begin() {
    ATL_RETURN_IF_ERROR(CudaError(int(cudaSetDevice(device_)), "set device"));
    if (!marked_) return absl::OkStatus();
    return CudaError(int(cudaStreamWaitEvent(stream_, compute_, 0)), "wait for the compute stream");
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ = nullptr;
  bool marked_ = false;
  void* staging_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SpanEngine>> SpanEngine::Cuda(int device) {
  std::string why;
  if (!cuda::Available(&why)) return absl::FailedPreconditionError(why);
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    return absl::FailedPreconditionError("no current CUDA device");
  }
  auto engine = std::make_unique<CudaEngine>(device);
  ATL_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<SpanEngine>(std::move(engine));
}

}  // namespace atl::compression

namespace atl::compression::cuda {

#else  // !ATOLL_HAVE_CUDA

namespace {
absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "this build has no CUDA kernels (configure with nvcc available and ATOLL_CUDA=AUTO or ON)");
}
}  // namespace

bool Supports(Codec) { return false; }
bool Supports(const CodecSpec&) { return false; }

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

}  // namespace atl::compression::cuda

namespace atl::compression {
absl::StatusOr<std::unique_ptr<SpanEngine>> SpanEngine::Cuda(int) { return cuda::NotBuilt(); }
}  // namespace atl::compression

namespace atl::compression::cuda {

#endif  // ATOLL_HAVE_CUDA

}  // namespace atl::compression::cuda
