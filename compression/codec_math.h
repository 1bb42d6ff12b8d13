// The arithmetic of the codecs, element by element and block by block, shared by the CPU codecs
// (codec.cc, built by the host compiler) and the CUDA kernels (codec_cuda.cu, built by nvcc):
// both compile this one code, so their outputs are bit-identical by construction. Every step is a
// single IEEE-754 operation rounded to nearest (no fused multiply-add can change a result: the
// products are by powers of two or exact), so the host and the device agree.
#ifndef ATOLL_COMPRESSION_CODEC_MATH_H_
#define ATOLL_COMPRESSION_CODEC_MATH_H_

#include <cstdint>
#include <cstring>

#include "compression/codec_spec.h"

#if defined(__CUDACC__)
#define ATOLL_HD __host__ __device__ __forceinline__
#else
#define ATOLL_HD inline
#endif

namespace atl::compression::math {

ATOLL_HD uint32_t Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ATOLL_HD float FromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

ATOLL_HD bool IsFinite(float f) { return (Bits(f) & 0x7F800000u) != 0x7F800000u; }

// |f| as bits: for finite values these order like the magnitudes.
ATOLL_HD uint32_t AbsBits(float f) { return Bits(f) & 0x7FFFFFFFu; }

// 2^k for k in [-149, 127], exact (subnormal below -126).
ATOLL_HD float Pow2(int k) {
  return k >= -126 ? FromBits(uint32_t(k + 127) << 23) : FromBits(1u << (k + 149));
}

// floor(log2 a) for finite a > 0, exact, subnormals included.
ATOLL_HD int FloorLog2(float a) {
  const uint32_t u = AbsBits(a);
  const int biased = int(u >> 23);
  if (biased > 0) return biased - 127;
#if defined(__CUDA_ARCH__)
  const int msb = 31 - __clz(int(u));
#else
  const int msb = 31 - __builtin_clz(u);
#endif
  return msb - 149;  // a subnormal is mantissa x 2^-149
}

// Round to nearest, ties to even, for |y| < 2^22: the addition rounds in the default mode.
ATOLL_HD float RoundHalfEven(float y) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (y + kMagic) - kMagic;
}

ATOLL_HD float Clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// ---- Stochastic rounding: a counter-based generator, so any element's draw is known from
// (seed, index) alone, whatever the chunking, the thread or the device.
ATOLL_HD uint64_t Mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64 started at `seed`: the index-th output.
ATOLL_HD uint64_t Draw(uint64_t seed, uint64_t index) {
  return Mix64(seed + (index + 1) * 0x9E3779B97F4A7C15ull);
}

// Uniform in [0, 1), a multiple of 2^-24 (exact in float).
ATOLL_HD float Uniform(uint64_t seed, uint64_t index) {
  return float(uint32_t(Draw(seed, index) >> 40)) * 5.9604644775390625e-08f;  // 2^-24
}

// ---- bf16: the top 16 bits of the float.
// Finite floats above bf16's largest finite value (3.3895314e38) would round to infinity, which
// no decoder accepts: they saturate to the largest finite bf16 of their sign instead.
ATOLL_HD uint16_t Bf16Saturate(uint16_t h) {
  return (h & 0x7F80u) == 0x7F80u ? uint16_t((h & 0x8000u) | 0x7F7Fu) : h;
}
ATOLL_HD uint16_t Bf16Nearest(float x) {
  const uint32_t u = Bits(x);
  return Bf16Saturate(uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16));
}
// Rounds away from zero with probability (dropped bits) / 2^16: unbiased (saturating as above).
ATOLL_HD uint16_t Bf16Stochastic(float x, uint64_t seed, uint64_t index) {
  return Bf16Saturate(uint16_t((Bits(x) + uint32_t(Draw(seed, index) & 0xFFFFu)) >> 16));
}
ATOLL_HD float Bf16Value(uint16_t h) { return FromBits(uint32_t(h) << 16); }

// ---- int8: per-block scale amax / 127, taken one ulp lower when 127 x scale would overflow (amax
// within an ulp of FLT_MAX), so that every code decodes to a finite value.
ATOLL_HD float Int8Scale(float amax) {
  const float s = amax / 127.0f;
  return IsFinite(s * 127.0f) ? s : FromBits(Bits(s) - 1u);
}
ATOLL_HD int8_t Int8Nearest(float x, float scale) {
  const float y = scale > 0 ? RoundHalfEven(x / scale) : 0.0f;
  return int8_t(Clamp(y, -127.0f, 127.0f));
}
ATOLL_HD int8_t Int8Stochastic(float x, float scale, float r) {
  if (!(scale > 0)) return 0;
  const float y = x / scale;
  // floor(y) without libm: |y| <= 127 (+ rounding), well inside RoundHalfEven's range.
  float lo = RoundHalfEven(y);
  if (lo > y) lo -= 1.0f;
  const float q = lo + (r < y - lo ? 1.0f : 0.0f);
  return int8_t(Clamp(q, -127.0f, 127.0f));
}

// ---- int2: per-block step q = amax / 3, codes c = 0..3 decode to (2c - 3) x q: -3q, -q, q, 3q,
// a uniform grid over [-amax, amax] (no zero level: a 2-bit code spends nothing on values a top-k
// selection has dropped). Nearest rounding has its thresholds at -2q, 0 and 2q, ties to the even
// code (0 goes to +q); stochastic rounding picks a neighbour with probability by distance, so it
// is unbiased inside [-amax, amax], where every value lies. q is one ulp lower when 3q would
// overflow. A zero block has q = 0: every code decodes to 0.
ATOLL_HD float Int2Step(float amax) {
  const float q = amax / 3.0f;
  return IsFinite(q * 3.0f) ? q : FromBits(Bits(q) - 1u);
}
ATOLL_HD uint8_t Int2Nearest(float x, float q) {
  if (!(q > 0)) return 2;
  const float y = x / q;
  return uint8_t(int(y > -2.0f) + int(y >= 0.0f) + int(y > 2.0f));
}
ATOLL_HD uint8_t Int2Stochastic(float x, float q, float r) {
  if (!(q > 0)) return 2;
  const float y = Clamp(x / q, -3.0f, 3.0f);
  // The level below y (the top level's lower neighbour at y = 3), then up with probability
  // (y - lower) / 2.
  const int c = int(y >= -1.0f) + int(y >= 1.0f);
  const float lower = float(2 * c - 3);
  return uint8_t(c + int(r * 2.0f < y - lower));
}
ATOLL_HD float Int2Value(uint8_t code, float q) { return float(2 * int(code & 3u) - 3) * q; }

// ---- 4-bit formats: sign bit 3, magnitude index in bits 0-2; block scale 2^e stored as the
// E8M0 byte e + 127, e = floor(log2 amax) - kScaleOffset, clamped to [-127, 127].
struct E2M1 {  // magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6
  static constexpr Codec kCodec = Codec::kFp4E2M1;
  static constexpr int kScaleOffset = 2;
  // The largest code that stays finite at scale 2^e: e <= 125 here (floor(log2 FLT_MAX) - 2), and
  // 6 x 2^125 is finite, so every code is.
  ATOLL_HD static int MaxCode(int) { return 7; }
  ATOLL_HD static float Magnitude(int c) {
    return c < 2 ? 0.5f * float(c) : (1.0f + 0.5f * float(c & 1)) * Pow2((c >> 1) - 1);
  }
  // Nearest magnitude, ties to the even code: the threshold after an odd code is passed on
  // equality, the one after an even code is not.
  ATOLL_HD static int Nearest(float v) {
    return int(v > 0.25f) + int(v >= 0.75f) + int(v > 1.25f) + int(v >= 1.75f) + int(v > 2.5f) +
           int(v >= 3.5f) + int(v > 5.0f);
  }
  // Largest code whose magnitude is <= v.
  ATOLL_HD static int Floor(float v) {
    return int(v >= 0.5f) + int(v >= 1.0f) + int(v >= 1.5f) + int(v >= 2.0f) + int(v >= 3.0f) +
           int(v >= 4.0f) + int(v >= 6.0f);
  }
};

struct E3M0 {  // magnitudes 0 and 2^-5 ... 2^1
  static constexpr Codec kCodec = Codec::kFp4E3M0;
  static constexpr int kScaleOffset = 0;
  // At scale 2^127 (amax >= 2^127) the top magnitude 2 x 2^127 overflows: saturate at 2^127.
  ATOLL_HD static int MaxCode(int e) { return e >= 127 ? 6 : 7; }
  ATOLL_HD static float Magnitude(int c) { return c == 0 ? 0.0f : Pow2(c - 6); }
  ATOLL_HD static int Nearest(float v) {
    return int(v > 0.015625f) + int(v >= 0.046875f) + int(v > 0.09375f) + int(v >= 0.1875f) +
           int(v > 0.375f) + int(v >= 0.75f) + int(v > 1.5f);
  }
  ATOLL_HD static int Floor(float v) {
    return int(v >= 0.03125f) + int(v >= 0.0625f) + int(v >= 0.125f) + int(v >= 0.25f) +
           int(v >= 0.5f) + int(v >= 1.0f) + int(v >= 2.0f);
  }
};

// Scale exponent of a block whose largest magnitude is amax.
template <class F>
ATOLL_HD int Fp4ScaleExponent(float amax) {
  int e = amax > 0 ? FloorLog2(amax) - F::kScaleOffset : -127;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

ATOLL_HD uint8_t Fp4WithSign(float x, int magnitude_code) {
  const int sign = int(Bits(x) >> 31) & int(magnitude_code != 0);  // zero is always +0
  return uint8_t(magnitude_code | (sign << 3));
}

ATOLL_HD int MinInt(int a, int b) { return a < b ? a : b; }

// inv_scale = 2^-e, so |x| * inv_scale is exact (or rounds the same way everywhere); max_code is
// F::MaxCode(e).
template <class F>
ATOLL_HD uint8_t Fp4Nearest(float x, float inv_scale, int max_code) {
  return Fp4WithSign(x, MinInt(F::Nearest(FromBits(AbsBits(x)) * inv_scale), max_code));
}

// Rounds |x| / scale up to the next magnitude with probability (v - lo) / (hi - lo): unbiased
// between neighbours. The gaps between magnitudes are powers of two and v - lo is exact (v and lo
// are within a factor of two), so the comparison is exact. Values past the largest magnitude
// saturate.
template <class F>
ATOLL_HD uint8_t Fp4Stochastic(float x, float inv_scale, float r, int max_code) {
  const float v = FromBits(AbsBits(x)) * inv_scale;
  int c = F::Floor(v);
  if (c < 7) {
    const float lo = F::Magnitude(c), gap = F::Magnitude(c + 1) - lo;
    c += int(r * gap < v - lo);
  }
  return Fp4WithSign(x, MinInt(c, max_code));
}

template <class F>
ATOLL_HD float Fp4Value(uint8_t code, float scale) {
  const float m = F::Magnitude(code & 7) * scale;
  return (code & 8) ? -m : m;
}

}  // namespace atl::compression::math

#endif  // ATOLL_COMPRESSION_CODEC_MATH_H_
