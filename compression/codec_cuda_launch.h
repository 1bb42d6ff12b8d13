// Internal: the kernel launchers of codec_cuda.cu, callable from host C++ without CUDA headers.
// Every function returns a cudaError_t value (0 is success) and runs on `stream` (a cudaStream_t).
#ifndef ATOLL_COMPRESSION_CODEC_CUDA_LAUNCH_H_
#define ATOLL_COMPRESSION_CODEC_CUDA_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "compression/codec_spec.h"
#include "compression/sparse_shape.h"

namespace atl::compression::cuda::detail {

// *first = index of the first non-finite value of in[0, n), or n. Synchronizes the stream.
int FirstNonFinite(const float* in, size_t n, size_t* first, void* stream);
// Whether the codec has kernels here (its row of codec_traits.h says so: a test holds them equal).
bool HasKernels(Codec codec);
// The spec is already valid; asynchronous. cudaErrorNotSupported for a codec without kernels.
int LaunchEncode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                 const Rounding& rounding, void* stream);
int LaunchDecode(const CodecSpec& spec, const uint8_t* in, size_t n, float* out, void* stream);
// Sparse specs (codec_cuda_sparse.cu): whether the value codec has kernels (those with dense ones),
// then the launchers. `values` is the value codec's layout, `chunk_bytes` a full chunk's bytes.
bool HasSparseKernels(Codec values);
// Asynchronous.
int LaunchSparseEncode(const CodecSpec& spec, const sparse::ValueLayout& values, size_t chunk_bytes,
                       const float* in, size_t n, uint8_t* out, const Rounding& rounding,
                       void* stream);
// *bad_chunk = the first chunk whose index list the kernel refused (nothing of it written), or
// SIZE_MAX. Synchronizes the stream.
int LaunchSparseDecode(const CodecSpec& spec, const sparse::ValueLayout& values, size_t chunk_bytes,
                       const uint8_t* in, size_t n, float* out, size_t* bad_chunk, void* stream);
// out[i] = a[i] - b[i]; asynchronous.
int LaunchSubtract(const float* a, const float* b, float* out, size_t n, void* stream);

}  // namespace atl::compression::cuda::detail

#endif  // ATOLL_COMPRESSION_CODEC_CUDA_LAUNCH_H_
