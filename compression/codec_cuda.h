// The codecs on a CUDA device: the same formats, rounding and checks as codec.h, bit for bit (both
// compile codec_math.h). For pseudo-gradients that live on the GPU: encoding there moves 7.5x
// fewer bytes over PCIe and keeps the CPU free. No CUDA header is needed to use this one; streams
// travel as void* (a cudaStream_t, nullptr for the default stream).
//
// Builds without CUDA (ATOLL_CUDA=OFF or no nvcc) keep these functions: Available() says why not,
// the others answer FAILED_PRECONDITION.
#ifndef ATOLL_COMPRESSION_CODEC_CUDA_H_
#define ATOLL_COMPRESSION_CODEC_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "compression/codec.h"

namespace atl::compression::cuda {

// True when the kernels are built in and a device is visible; otherwise false and *why says what
// is missing.
bool Available(std::string* why = nullptr);
// Whether `codec` has kernels in this build (its row of codec_traits.h says whether it should).
bool Supports(Codec codec);
// Whether `spec` has kernels: a dense codec with them, or a sparse one whose value codec has them.
bool Supports(const CodecSpec& spec);

// Device pointers. Refuses non-finite input (naming the first bad index) before writing anything;
// returns once the stream has finished.
absl::Status EncodeOnDevice(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                            const Rounding& rounding = {}, void* stream = nullptr);
absl::Status DecodeOnDevice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                            float* out, void* stream = nullptr);

// Host buffers staged through device memory: for tests, benchmarks and callers without device
// buffers of their own.
absl::Status EncodeViaDevice(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                             const Rounding& rounding = {});
absl::Status DecodeViaDevice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                             float* out);

}  // namespace atl::compression::cuda

#endif  // ATOLL_COMPRESSION_CODEC_CUDA_H_
