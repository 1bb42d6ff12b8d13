// Vector kernels for the hot paths of the FP4 codecs (blocks of 32, MXFP4's size, rounded to
// nearest): x86-64 AVX2, chosen at run time when the CPU has it. They compute exactly what the
// scalar code of codec_math.h computes (the same comparisons against the same thresholds, the same
// exact products), and a test holds them to it byte for byte. Internal to compression/.
#ifndef ATOLL_COMPRESSION_CODEC_SIMD_H_
#define ATOLL_COMPRESSION_CODEC_SIMD_H_

#include <cstddef>
#include <cstdint>

#include "compression/codec_spec.h"

namespace atl::compression::simd {

// Whether the vector kernels run: the CPU supports them and tests have not turned them off.
bool Enabled();
// Tests compare the two paths; the scalar code is the reference.
void SetEnabledForTesting(bool on);

// nblocks whole blocks of 32 values: scale bytes into scales[nblocks], codes into
// codes[16 * nblocks]. `codec` is kFp4E2M1 or kFp4E3M0. Only call when Enabled(). Returns the
// largest magnitude seen, as bits (>= 0x7F800000 when some input is not finite).
uint32_t EncodeFp4Blocks32(Codec codec, size_t nblocks, const float* in, uint8_t* scales,
                       uint8_t* codes);
// The reverse: 32 * nblocks values into out.
void DecodeFp4Blocks32(Codec codec, size_t nblocks, const uint8_t* scales, const uint8_t* codes,
                       float* out);

}  // namespace atl::compression::simd

#endif  // ATOLL_COMPRESSION_CODEC_SIMD_H_
