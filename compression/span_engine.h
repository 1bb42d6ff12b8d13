// The codecs and the little arithmetic an island's device copy of the global parameters needs
// (outer/island/device_copy.h), over the memory of one device: the host (the CPU codecs) or a CUDA device
// (the kernels of codec_cuda.h, on a stream of the engine's own, so that they overlap the training
// on the compute stream). Results are bit for bit the same on both (codec_math.h, -fmad=false).
//
// Pointers named `dev` are in the engine's memory (host memory for the host engine); `host` ones
// are ordinary host memory. Every call returns once its work is done, so its results are ready
// for any stream or thread; only the calling thread waits (the compute stream never does, except
// where AfterCompute says).
//
// Threading: one engine belongs to one thread at a time; MarkCompute is the training thread's.
#ifndef ATOLL_COMPRESSION_SPAN_ENGINE_H_
#define ATOLL_COMPRESSION_SPAN_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec_spec.h"

namespace atl::compression {

class SpanEngine {
 public:
  virtual ~SpanEngine() = default;
  // The host's: compression::Encode / Decode and plain loops.
  static std::unique_ptr<SpanEngine> Host();
  // CUDA device `device` (the current one of the calling thread when -1), with a stream of its
  // own; FAILED_PRECONDITION without a device or a build without the kernels.
  static absl::StatusOr<std::unique_ptr<SpanEngine>> Cuda(int device = -1);

  virtual bool on_device() const = 0;
  // Records where the compute stream (the device's default stream, where libtorch trains) is now:
  // the engine's later work waits for what the compute stream had queued by then. The host
  // engine has nothing to wait for.
  virtual absl::Status MarkCompute() = 0;

  // The codecs (codec.h's formats and checks) from and to the engine's memory.
  virtual absl::Status Encode(const CodecSpec& spec, const float* dev_in, size_t n,
                              uint8_t* dev_out, const Rounding& rounding) = 0;
  virtual absl::Status Decode(const CodecSpec& spec, const uint8_t* dev_in, size_t bytes, size_t n,
                              float* dev_out) = 0;
  // dev_out[i] = dev_a[i] - dev_b[i] (dev_out may be dev_a).
  virtual absl::Status Subtract(const float* dev_a, const float* dev_b, float* dev_out,
                                size_t n) = 0;
  // Copies between the engine's memory and the host's (through pinned staging on a device).
  virtual absl::Status ToHost(void* host, const void* dev, size_t bytes) = 0;
  virtual absl::Status FromHost(void* dev, const void* host, size_t bytes) = 0;
};

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_SPAN_ENGINE_H_
