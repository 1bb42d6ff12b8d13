// Internal to compression/: the codecs' rows of the traits table (codec_traits.h), each defined
// in its codec's file, and what their encoders share.
#ifndef ATOLL_COMPRESSION_CODEC_ROWS_H_
#define ATOLL_COMPRESSION_CODEC_ROWS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "compression/codec_math.h"
#include "compression/codec_traits.h"

namespace atl::compression {

extern const CodecTraits kFp32Codec;      // codec_float.cc
extern const CodecTraits kBf16Codec;      // codec_float.cc
extern const CodecTraits kInt8Codec;      // codec_int8.cc
extern const CodecTraits kFp4E2M1Codec;   // codec_fp4.cc
extern const CodecTraits kFp4E3M0Codec;   // codec_fp4.cc
extern const CodecTraits kFp8E4M3Codec;   // codec_fp8.cc
extern const CodecTraits kInt2Codec;      // codec_int2.cc
extern const CodecTraits kInt2CentroidCodec;  // codec_int2.cc

// Largest magnitude of a block of finite values: as bit patterns, non-negative floats order like
// unsigned integers, which vectorizes.
inline float BlockAmax(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, math::AbsBits(x[i]));
  return math::FromBits(m);
}

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CODEC_ROWS_H_
