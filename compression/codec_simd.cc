#include "compression/codec_simd.h"

#include <algorithm>
#include <atomic>

#include "compression/codec_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATOLL_X86_SIMD 1
#include <immintrin.h>
#endif

namespace atl::compression::simd {
namespace {

std::atomic<bool> g_disabled{false};

#if ATOLL_X86_SIMD

using math::E2M1;
using math::E3M0;

// The seven thresholds of F::Nearest, compared alternately with > and >= (ties to the even code).
template <class F>
struct Thresholds;
template <>
struct Thresholds<E2M1> {
  static constexpr float t[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
};
template <>
struct Thresholds<E3M0> {
  static constexpr float t[7] = {0.015625f, 0.046875f, 0.09375f, 0.1875f, 0.375f, 0.75f, 1.5f};
};

// The magnitude code of eight |x| / scale values: the count of thresholds passed. The values are
// non-negative (or +0), so they order like their bits: v > t is bits(v) > bits(t), and v >= t is
// bits(v) > bits(t) - 1, integer comparisons (cheaper than float ones).
template <class F>
struct CodeThresholds {
  __attribute__((target("avx2"))) CodeThresholds() {
    for (int k = 0; k < 7; ++k) {
      const uint32_t bits = math::Bits(Thresholds<F>::t[k]);
      t[k] = _mm256_set1_epi32(int(k % 2 ? bits - 1 : bits));  // >, >=, >, >=, ...
    }
  }
  __m256i t[7];
};

template <class F>
__attribute__((target("avx2"))) inline __m256i MagnitudeCodes(__m256i v,
                                                              const CodeThresholds<F>& t) {
  __m256i s = _mm256_cmpgt_epi32(v, t.t[0]);
  for (int k = 1; k < 7; ++k) s = _mm256_add_epi32(s, _mm256_cmpgt_epi32(v, t.t[k]));
  return _mm256_sub_epi32(_mm256_setzero_si256(), s);  // each passed threshold added -1
}

// The low 64 bits of a x b in each 64-bit lane (AVX2 multiplies 32 x 32 -> 64 only):
// a_lo b_lo + ((a_hi b_lo + a_lo b_hi) << 32). b_hi is b >> 32, given by the caller.
__attribute__((target("avx2"))) inline __m256i Mul64(__m256i a, __m256i b, __m256i b_hi) {
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                         _mm256_mul_epu32(a, b_hi));
  return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
}

// math::Uniform(seed, index + j) for j = 0..7, in lane j: splitmix64's finalizer (math::Mix64)
// on four 64-bit lanes at a time, its top 24 bits as a float times 2^-24. Exact: the same
// integers, and a 24-bit integer converts to float without rounding.
struct UniformDraws {
  __attribute__((target("avx2"))) UniformDraws()
      : c1(_mm256_set1_epi64x(int64_t(0xBF58476D1CE4E5B9ull))),
        c1_hi(_mm256_srli_epi64(c1, 32)),
        c2(_mm256_set1_epi64x(int64_t(0x94D049BB133111EBull))),
        c2_hi(_mm256_srli_epi64(c2, 32)),
        steps_lo(_mm256_setr_epi64x(int64_t(1 * kGolden), int64_t(2 * kGolden), int64_t(3 * kGolden),
                                    int64_t(4 * kGolden))),
        steps_hi(_mm256_setr_epi64x(int64_t(5 * kGolden), int64_t(6 * kGolden), int64_t(7 * kGolden),
                                    int64_t(8 * kGolden))) {}
  template <int kShift>
  __attribute__((target("avx2"))) __m256i Mix(__m256i z) const {
    z = Mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), c1, c1_hi);
    z = Mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), c2, c2_hi);
    return _mm256_srli_epi64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 31)), kShift);
  }
  // The low 32 bits of math::Draw(seed, index + j) >> kShift, in lane j.
  template <int kShift>
  __attribute__((target("avx2"))) __m256i Raw(uint64_t seed, uint64_t index) const {
    // z = seed + (index + 1 + j) x golden; index x golden wraps mod 2^64 as the scalar code's does.
    const __m256i base = _mm256_set1_epi64x(int64_t(seed + index * kGolden));
    const __m256i lo = Mix<kShift>(_mm256_add_epi64(base, steps_lo));
    const __m256i hi = Mix<kShift>(_mm256_add_epi64(base, steps_hi));
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128i a = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(lo, order));
    const __m128i b = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(hi, order));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
  }
  __attribute__((target("avx2"))) __m256 Eight(uint64_t seed, uint64_t index) const {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(Raw<40>(seed, index)), _mm256_set1_ps(5.9604644775390625e-08f));
  }
  static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  __m256i c1, c1_hi, c2, c2_hi, steps_lo, steps_hi;
};

// Stochastic magnitude codes of eight |x| / scale values, as math::Fp4Stochastic: the largest
// code at or below v, plus one with probability (v - its magnitude) / (the gap to the next).
template <class F>
struct StochasticCodes {
  __attribute__((target("avx2"))) StochasticCodes() {
    alignas(32) float lo[8], next[8];
    for (int c = 0; c < 8; ++c) {
      lo[c] = F::Magnitude(c);
      next[c] = c < 7 ? F::Magnitude(c + 1) : 0.0f;
    }
    for (int k = 0; k < 7; ++k) floor_t[k] = _mm256_set1_epi32(int(math::Bits(F::Magnitude(k + 1)) - 1));
    magnitude = _mm256_load_ps(lo);
    next_magnitude = _mm256_load_ps(next);
  }
  __attribute__((target("avx2"))) __m256i Codes(__m256 v, __m256 r) const {
    // Floor: thresholds passed with >= (bits(v) > bits(t) - 1; v is non-negative).
    const __m256i vb = _mm256_castps_si256(v);
    __m256i s = _mm256_cmpgt_epi32(vb, floor_t[0]);
    for (int k = 1; k < 7; ++k) s = _mm256_add_epi32(s, _mm256_cmpgt_epi32(vb, floor_t[k]));
    const __m256i c = _mm256_sub_epi32(_mm256_setzero_si256(), s);
    const __m256 lo = _mm256_permutevar8x32_ps(magnitude, c);
    const __m256 gap = _mm256_sub_ps(_mm256_permutevar8x32_ps(next_magnitude, c), lo);
    const __m256 up = _mm256_cmp_ps(_mm256_mul_ps(r, gap), _mm256_sub_ps(v, lo), _CMP_LT_OQ);
    const __m256i below_top = _mm256_cmpgt_epi32(_mm256_set1_epi32(7), c);
    // up and below the top code: c - (-1).
    return _mm256_sub_epi32(c, _mm256_and_si256(_mm256_castps_si256(up), below_top));
  }
  __m256i floor_t[7];
  __m256 magnitude, next_magnitude;
};

// Rounding to nearest (kStochastic false) or stochastically with the draws of (seed, first + i).
template <class F, bool kStochastic>
__attribute__((target("avx2"))) uint32_t Encode(size_t nblocks, const float* in, uint8_t* scales,
                                                uint8_t* codes, uint64_t seed, uint64_t first) {
  uint32_t all = 0;
  const CodeThresholds<F> thresholds;
  const StochasticCodes<F> stochastic;
  const UniformDraws draws;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i eight = _mm256_set1_epi32(8);
  const __m256i zero = _mm256_setzero_si256();
  for (size_t b = 0; b < nblocks; ++b) {
    const float* src = in + b * 32;
    __m256i x[4], a[4];
    for (int k = 0; k < 4; ++k) {
      x[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8 * k));
      a[k] = _mm256_and_si256(x[k], abs_mask);
    }
    // amax as bits (non-negative floats order like unsigned integers), then the scale.
    const __m256i m8 = _mm256_max_epu32(_mm256_max_epu32(a[0], a[1]), _mm256_max_epu32(a[2], a[3]));
    __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m8), _mm256_extracti128_si256(m8, 1));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4E));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xB1));
    const uint32_t amax = uint32_t(_mm_cvtsi128_si32(m4));
    all = all > amax ? all : amax;
    const int e = math::Fp4ScaleExponent<F>(math::FromBits(amax));
    scales[b] = uint8_t(e + 127);
    const __m256 inv = _mm256_set1_ps(math::Pow2(-e));
    const __m256i max_code = _mm256_set1_epi32(F::MaxCode(e));
    __m256i c[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(a[k]), inv);
      __m256i code;
      if constexpr (kStochastic) {
        code = stochastic.Codes(v, draws.Eight(seed, first + b * 32 + 8 * k));
      } else {
        code = MagnitudeCodes<F>(_mm256_castps_si256(v), thresholds);
      }
      code = _mm256_min_epi32(code, max_code);
      // The sign bit, except on zero (always +0).
      const __m256i negative = _mm256_srai_epi32(x[k], 31);
      const __m256i nonzero = _mm256_cmpgt_epi32(code, zero);
      c[k] = _mm256_or_si256(code, _mm256_and_si256(_mm256_and_si256(negative, nonzero), eight));
    }
    // 32 codes (int32) into 32 bytes in element order, then pairs into nibbles (low first).
    const __m256i p = _mm256_permutevar8x32_epi32(
        _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3])),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m256i w = _mm256_or_si256(_mm256_and_si256(p, _mm256_set1_epi16(0x000F)),
                                      _mm256_and_si256(_mm256_srli_epi16(p, 4), _mm256_set1_epi16(0x00F0)));
    const __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * 16), packed);
  }
  return all;
}

template <class F>
__attribute__((target("avx2"))) void Decode(size_t nblocks, const uint8_t* scales,
                                            const uint8_t* codes, float* out) {
  const __m128i low_nibbles = _mm_set1_epi8(0x0F);
  const __m256i seven = _mm256_set1_epi32(7), eight = _mm256_set1_epi32(8);
  for (size_t b = 0; b < nblocks; ++b) {
    const float scale = math::Pow2(int(scales[b]) - 127);
    alignas(32) float table[8];
    for (int c = 0; c < 8; ++c) table[c] = math::Fp4Value<F>(uint8_t(c), scale);
    const __m256 magnitudes = _mm256_load_ps(table);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b * 16));
    const __m128i lo = _mm_and_si128(bytes, low_nibbles);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibbles);
    // Element order: byte i holds elements 2i (low nibble) and 2i + 1 (high nibble).
    const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
    const __m128i parts[4] = {first, _mm_srli_si128(first, 8), second, _mm_srli_si128(second, 8)};
    for (int k = 0; k < 4; ++k) {
      const __m256i code = _mm256_cvtepu8_epi32(parts[k]);
      const __m256 m = _mm256_permutevar8x32_ps(magnitudes, _mm256_and_si256(code, seven));
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, eight), 28);
      _mm256_storeu_ps(out + b * 32 + 8 * k,
                       _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(m), sign)));
    }
  }
}

// The largest |x| of in[0, n) as bits, eight at a time, the rest one by one.
__attribute__((target("avx2"))) uint32_t AmaxBits(const float* in, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), abs_mask));
  }
  __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4E));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xB1));
  uint32_t all = uint32_t(_mm_cvtsi128_si32(m4));
  for (; i < n; ++i) all = std::max(all, math::AbsBits(in[i]));
  return all;
}

// Left-packing: entry m holds the positions of mask m's set bits, lowest first (the rest 0).
struct PackTable {
  uint8_t pos[256][8] = {};
  constexpr PackTable() {
    for (int m = 0; m < 256; ++m) {
      int n = 0;
      for (int b = 0; b < 8; ++b) {
        if (m & (1 << b)) pos[m][n++] = uint8_t(b);
      }
    }
  }
};
constexpr PackTable kPack;

// Eight at a time: compare the magnitudes' bits with the floor, store the passing lanes' indices
// packed to the front (the store may run past them; the next one overwrites), count them.
__attribute__((target("avx2"))) size_t AtLeast(const float* in, size_t n, uint32_t floor_bits,
                                               uint32_t* idx, uint32_t* amax) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), eight = _mm256_set1_epi32(8);
  // |x| bits <= 0x7FFFFFFF compare correctly as signed numbers; floor 0 passes everything.
  const __m256i below = _mm256_set1_epi32(int32_t(floor_bits) - 1);
  __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), m = _mm256_setzero_si256();
  size_t count = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), abs_mask);
    m = _mm256_max_epu32(m, a);
    const unsigned mask = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, below))));
    const __m256i order = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kPack.pos[mask])));
    // count <= i, so the eight stored stay inside idx[n].
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + count), _mm256_permutevar8x32_epi32(lanes, order));
    count += size_t(__builtin_popcount(mask));
    lanes = _mm256_add_epi32(lanes, eight);
  }
  __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4E));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xB1));
  uint32_t all = uint32_t(_mm_cvtsi128_si32(m4));
  for (; i < n; ++i) {
    const uint32_t a = math::AbsBits(in[i]);
    all = std::max(all, a);
    if (a >= floor_bits) idx[count++] = uint32_t(i);
  }
  *amax = all;
  return count;
}

// math::Int8Stochastic on len values of one block (scale > 0), eight at a time; returns how many
// it did (a multiple of 8: the caller does the rest).
__attribute__((target("avx2"))) size_t Int8Stochastic(const float* in, size_t len, float scale,
                                                      uint64_t seed, uint64_t first, int8_t* q) {
  const UniformDraws draws;
  const __m256 s = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f);
  const __m256 lo_clamp = _mm256_set1_ps(-127.0f), hi_clamp = _mm256_set1_ps(127.0f);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256 y = _mm256_div_ps(_mm256_loadu_ps(in + i), s);  // a division, as the scalar code
    __m256 lo = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    lo = _mm256_sub_ps(lo, _mm256_and_ps(_mm256_cmp_ps(lo, y, _CMP_GT_OQ), one));
    const __m256 up = _mm256_cmp_ps(draws.Eight(seed, first + i), _mm256_sub_ps(y, lo), _CMP_LT_OQ);
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(lo, _mm256_and_ps(up, one)), lo_clamp), hi_clamp);
    const __m256i w = _mm256_cvtps_epi32(v);  // integral already
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(p16, p16));
  }
  return i;
}

// math::Int2Stochastic on len values, eight at a time; returns how many it did.
__attribute__((target("avx2"))) size_t Int2Stochastic(const float* in, size_t len, float q,
                                                      uint64_t seed, uint64_t first,
                                                      uint8_t* codes) {
  const UniformDraws draws;
  const __m256 step = _mm256_set1_ps(q), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
  const __m256 three = _mm256_set1_ps(3.0f), minus_three = _mm256_set1_ps(-3.0f);
  const __m256 minus_one = _mm256_set1_ps(-1.0f);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    // y = clamp(x / q, -3, 3); c = (y >= -1) + (y >= 1); up when r x 2 < y - (2c - 3).
    const __m256 y = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(in + i), step),
                                                 minus_three), three);
    const __m256 c = _mm256_add_ps(_mm256_and_ps(_mm256_cmp_ps(y, minus_one, _CMP_GE_OQ), one),
                                   _mm256_and_ps(_mm256_cmp_ps(y, one, _CMP_GE_OQ), one));
    const __m256 lower = _mm256_sub_ps(_mm256_mul_ps(c, two), three);
    const __m256 up = _mm256_cmp_ps(_mm256_mul_ps(draws.Eight(seed, first + i), two),
                                    _mm256_sub_ps(y, lower), _CMP_LT_OQ);
    const __m256i w = _mm256_cvtps_epi32(_mm256_add_ps(c, _mm256_and_ps(up, one)));
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(p16, p16));
  }
  return i;
}

// math::Bf16Stochastic on n values, eight at a time; returns how many it did.
__attribute__((target("avx2"))) size_t Bf16Stochastic(const float* in, size_t n, uint64_t seed,
                                                      uint64_t first, uint8_t* out) {
  const UniformDraws draws;
  const __m256i low16 = _mm256_set1_epi32(0xFFFF), exponent = _mm256_set1_epi32(0x7F80);
  const __m256i sign = _mm256_set1_epi32(0x8000), largest = _mm256_set1_epi32(0x7F7F);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i r = _mm256_and_si256(draws.Raw<0>(seed, first + i), low16);
    const __m256i h = _mm256_srli_epi32(_mm256_add_epi32(x, r), 16);
    // math::Bf16Saturate: an all-ones exponent becomes the largest finite value of its sign.
    const __m256i overflow = _mm256_cmpeq_epi32(_mm256_and_si256(h, exponent), exponent);
    const __m256i saturated = _mm256_or_si256(_mm256_and_si256(h, sign), largest);
    const __m256i v = _mm256_blendv_epi8(h, saturated, overflow);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), packed);
  }
  return i;
}

bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

#endif  // ATOLL_X86_SIMD

}  // namespace

bool Enabled() {
#if ATOLL_X86_SIMD
  return CpuHasAvx2() && !g_disabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void SetEnabledForTesting(bool on) { g_disabled.store(!on); }

uint32_t EncodeFp4Blocks32(Codec codec, size_t nblocks, const float* in, uint8_t* scales,
                           uint8_t* codes) {
#if ATOLL_X86_SIMD
  return codec == Codec::kFp4E2M1 ? Encode<E2M1, false>(nblocks, in, scales, codes, 0, 0)
                                  : Encode<E3M0, false>(nblocks, in, scales, codes, 0, 0);
#else
  (void)codec, (void)nblocks, (void)in, (void)scales, (void)codes;
  return 0;
#endif
}

uint32_t EncodeFp4Blocks32Stochastic(Codec codec, size_t nblocks, const float* in, uint8_t* scales,
                                     uint8_t* codes, uint64_t seed, uint64_t first_index) {
#if ATOLL_X86_SIMD
  return codec == Codec::kFp4E2M1
             ? Encode<E2M1, true>(nblocks, in, scales, codes, seed, first_index)
             : Encode<E3M0, true>(nblocks, in, scales, codes, seed, first_index);
#else
  (void)codec, (void)nblocks, (void)in, (void)scales, (void)codes, (void)seed, (void)first_index;
  return 0;
#endif
}

uint32_t BlockAmaxBits(const float* in, size_t n) {
#if ATOLL_X86_SIMD
  return AmaxBits(in, n);
#else
  (void)in, (void)n;
  return 0;
#endif
}

size_t IndicesAtLeast(const float* in, size_t n, uint32_t floor_bits, uint32_t* idx,
                      uint32_t* amax) {
#if ATOLL_X86_SIMD
  return AtLeast(in, n, floor_bits, idx, amax);
#else
  (void)in, (void)n, (void)floor_bits, (void)idx, (void)amax;
  return 0;
#endif
}

size_t EncodeInt8Stochastic(const float* in, size_t len, float scale, uint64_t seed,
                            uint64_t first_index, int8_t* q) {
#if ATOLL_X86_SIMD
  return Int8Stochastic(in, len, scale, seed, first_index, q);
#else
  (void)in, (void)len, (void)scale, (void)seed, (void)first_index, (void)q;
  return 0;
#endif
}

size_t EncodeInt2Stochastic(const float* in, size_t len, float q, uint64_t seed,
                            uint64_t first_index, uint8_t* codes) {
#if ATOLL_X86_SIMD
  return Int2Stochastic(in, len, q, seed, first_index, codes);
#else
  (void)in, (void)len, (void)q, (void)seed, (void)first_index, (void)codes;
  return 0;
#endif
}

size_t EncodeBf16Stochastic(const float* in, size_t n, uint64_t seed, uint64_t first_index,
                            uint8_t* out) {
#if ATOLL_X86_SIMD
  return Bf16Stochastic(in, n, seed, first_index, out);
#else
  (void)in, (void)n, (void)seed, (void)first_index, (void)out;
  return 0;
#endif
}

void DecodeFp4Blocks32(Codec codec, size_t nblocks, const uint8_t* scales, const uint8_t* codes,
                       float* out) {
#if ATOLL_X86_SIMD
  if (codec == Codec::kFp4E2M1) {
    Decode<E2M1>(nblocks, scales, codes, out);
  } else {
    Decode<E3M0>(nblocks, scales, codes, out);
  }
#else
  (void)codec, (void)nblocks, (void)scales, (void)codes, (void)out;
#endif
}

}  // namespace atl::compression::simd
