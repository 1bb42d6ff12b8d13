// FP4: per block an E8M0 scale byte (2^(byte - 127)), then 4-bit codes (element i in byte i / 2,
// low nibble first; bit 3 the sign, bits 0-2 the magnitude's index). E2M1 (MXFP4): magnitudes
// {0, 0.5, 1, 1.5, 2, 3, 4, 6} x scale with scale = 2^(floor(log2 amax) - 2); E3M0: {0} and
// {2^-5 .. 2} x scale with scale = 2^floor(log2 amax). The arithmetic is codec_math.h's; blocks
// of 32 rounded to nearest take the vector kernels of codec_simd.h when the CPU has them.
#include "compression/codec_rows.h"
#include "compression/codec_simd.h"

namespace atl::compression {
namespace {

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

// Whole blocks of a block size known at compile time (MXFP4's 32): the compiler unrolls and
// vectorizes the amax, the codes and the packing of each block as one unit.
// Returns the largest magnitude seen, as bits (non-finite input shows as >= 0x7F800000).
template <class F, uint32_t kBlock>
uint32_t EncodeFp4FullBlocks(size_t nblocks, const float* in, uint8_t* scales, uint8_t* codes) {
  uint32_t all = 0;
  for (size_t b = 0; b < nblocks; ++b) {
    const float* src = in + b * kBlock;
    uint32_t m = 0;
    for (uint32_t i = 0; i < kBlock; ++i) m = std::max(m, AbsBits(src[i]));
    all = std::max(all, m);
    const int e = Fp4ScaleExponent<F>(FromBits(m));
    scales[b] = uint8_t(e + 127);
    const float inv = Pow2(-e);
    const int max_code = F::MaxCode(e);
    uint8_t c[kBlock];
    for (uint32_t i = 0; i < kBlock; ++i) c[i] = Fp4Nearest<F>(src[i], inv, max_code);
    uint8_t* dst = codes + b * (kBlock / 2);
    for (uint32_t i = 0; i < kBlock / 2; ++i) dst[i] = uint8_t(c[2 * i] | (c[2 * i + 1] << 4));
  }
  return all;
}

// Returns the largest magnitude seen, as bits: the caller refuses non-finite input afterwards, so
// that the values are read once.
template <class F, bool kStochastic>
uint32_t EncodeFp4(uint32_t block, const float* in, size_t n, uint8_t* out,
                   const Rounding& rounding) {
  const size_t nblocks = (n + block - 1) / block;
  uint8_t* scales = out;
  uint8_t* codes = out + nblocks;
  size_t b = 0;
  uint32_t all = 0;
  if (!kStochastic && block == 32) {
    b = n / 32;  // whole blocks; the general loop does a partial last one
    all = simd::Enabled() ? simd::EncodeFp4Blocks32(F::kCodec, b, in, scales, codes)
                          : EncodeFp4FullBlocks<F, 32>(b, in, scales, codes);
  } else if (kStochastic && block == 32 && simd::Enabled()) {
    b = n / 32;
    all = simd::EncodeFp4Blocks32Stochastic(F::kCodec, b, in, scales, codes, rounding.seed,
                                            rounding.first_index);
  }
  uint8_t tmp[4096 + 1];  // + 1: the pad of an odd last block
  for (; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float amax = BlockAmax(in + first, len);
    all = std::max(all, AbsBits(amax));
    const int e = Fp4ScaleExponent<F>(amax);
    scales[b] = uint8_t(e + 127);
    const float inv = Pow2(-e);
    const int max_code = F::MaxCode(e);
    const float* src = in + first;
    if constexpr (kStochastic) {
      const uint64_t base = rounding.first_index + first;
      for (size_t i = 0; i < len; ++i) {
        tmp[i] = Fp4Stochastic<F>(src[i], inv, Uniform(rounding.seed, base + i), max_code);
      }
    } else {
      for (size_t i = 0; i < len; ++i) tmp[i] = Fp4Nearest<F>(src[i], inv, max_code);
    }
    tmp[len] = 0;  // pads an odd last block
    uint8_t* dst = codes + first / 2;  // blocks are even, so each starts on a byte
    for (size_t i = 0; i < (len + 1) / 2; ++i) dst[i] = uint8_t(tmp[2 * i] | (tmp[2 * i + 1] << 4));
  }
  return all;
}

// Elements [lo, hi) of a payload of nblocks blocks into out[0, hi - lo).
template <class F>
void DecodeFp4Scalar(uint32_t block, const uint8_t* in, size_t nblocks, size_t lo, size_t hi,
                     float* out) {
  const uint8_t* codes = in + nblocks;
  for (size_t b = lo / block; b * block < hi; ++b) {
    const size_t first = std::max(b * block, lo), last = std::min((b + 1) * block, hi);
    const float scale = Pow2(int(in[b]) - 127);
    float table[16];
    for (int c = 0; c < 16; ++c) table[c] = Fp4Value<F>(uint8_t(c), scale);
    for (size_t k = first; k < last; ++k) out[k - lo] = table[(codes[k / 2] >> ((k & 1) * 4)) & 0xF];
  }
}

// Elements [lo, hi) of an n-element payload into out[0, hi - lo): the whole blocks of 32 inside
// the range by the vector kernel when there is one, the rest by the scalar loop.
template <class F>
void DecodeFp4(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  if (block != 32 || !simd::Enabled()) return DecodeFp4Scalar<F>(block, in, nblocks, lo, hi, out);
  const size_t first_block = (lo + 31) / 32, last_block = hi / 32;  // whole blocks: [first, last)
  if (first_block >= last_block) return DecodeFp4Scalar<F>(block, in, nblocks, lo, hi, out);
  DecodeFp4Scalar<F>(block, in, nblocks, lo, first_block * 32, out);
  simd::DecodeFp4Blocks32(F::kCodec, last_block - first_block, in + first_block,
                          in + nblocks + first_block * 16, out + (first_block * 32 - lo));
  DecodeFp4Scalar<F>(block, in, nblocks, last_block * 32, hi, out + (last_block * 32 - lo));
}

template <class F>
uint32_t EncodeFp4(uint32_t block, const float* in, size_t n, uint8_t* out,
                   const Rounding& rounding) {
  return rounding.stochastic ? EncodeFp4<F, true>(block, in, n, out, rounding)
                             : EncodeFp4<F, false>(block, in, n, out, rounding);
}

}  // namespace

const CodecTraits kFp4E2M1Codec = {.id = Codec::kFp4E2M1,
                                   .name = "fp4_e2m1",
                                   .default_block = 32,
                                   .min_block = 2,
                                   .max_block = 4096,
                                   .block_multiple = 2,
                                   .block_bytes = 1,
                                   .element_bits = 4,
                                   .encode = EncodeFp4<E2M1>,
                                   .checks_finite = true,
                                   .decode = DecodeFp4<E2M1>,
                                   .stochastic_rounding = true,
                                   .simd = true,
                                   .cuda = true};
const CodecTraits kFp4E3M0Codec = {.id = Codec::kFp4E3M0,
                                   .name = "fp4_e3m0",
                                   .default_block = 32,
                                   .min_block = 2,
                                   .max_block = 4096,
                                   .block_multiple = 2,
                                   .block_bytes = 1,
                                   .element_bits = 4,
                                   .encode = EncodeFp4<E3M0>,
                                   .checks_finite = true,
                                   .decode = DecodeFp4<E3M0>,
                                   .stochastic_rounding = true,
                                   .simd = true,
                                   .cuda = true};

}  // namespace atl::compression
