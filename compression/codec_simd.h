// Vector kernels for the codecs' hot paths (FP4 blocks of 32, MXFP4's size, rounded to nearest or
// stochastically; stochastic int8 and bf16): x86-64 AVX2, chosen at run time when the CPU has it. They compute exactly what the
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
// The same with stochastic rounding: element i draws math::Uniform(seed, first_index + i), exactly
// as the scalar code does.
uint32_t EncodeFp4Blocks32Stochastic(Codec codec, size_t nblocks, const float* in, uint8_t* scales,
                                     uint8_t* codes, uint64_t seed, uint64_t first_index);
// The largest |in[i]| of in[0, n), as bits (as the scalar BlockAmax finds it).
uint32_t BlockAmaxBits(const float* in, size_t n);
// The indices i of in[0, n) with |in[i]|'s bits >= floor_bits, ascending, into idx (room for n):
// returns how many, and the largest magnitude's bits of all n into *amax. All n elements.
size_t IndicesAtLeast(const float* in, size_t n, uint32_t floor_bits, uint32_t* idx,
                      uint32_t* amax);
// Stochastic int8 codes (math::Int8Stochastic) of in[0, len) at scale > 0, element i drawing
// math::Uniform(seed, first_index + i): returns how many were done (a multiple of 8; the caller
// does the rest).
size_t EncodeInt8Stochastic(const float* in, size_t len, float scale, uint64_t seed,
                            uint64_t first_index, int8_t* q);
// Stochastic int2 codes (math::Int2Stochastic, one code per byte) of in[0, len) at step q > 0,
// element i drawing math::Uniform(seed, first_index + i): returns how many were done, as above.
size_t EncodeInt2Stochastic(const float* in, size_t len, float q, uint64_t seed,
                            uint64_t first_index, uint8_t* codes);
// Stochastic bf16 (math::Bf16Stochastic) of in[0, n) into out (2 bytes each, little-endian):
// returns how many were done, as above.
size_t EncodeBf16Stochastic(const float* in, size_t n, uint64_t seed, uint64_t first_index,
                            uint8_t* out);
// The reverse: 32 * nblocks values into out.
void DecodeFp4Blocks32(Codec codec, size_t nblocks, const uint8_t* scales, const uint8_t* codes,
                       float* out);

}  // namespace atl::compression::simd

#endif  // ATOLL_COMPRESSION_CODEC_SIMD_H_
