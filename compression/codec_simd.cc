#include "compression/codec_simd.h"

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

template <class F>
__attribute__((target("avx2"))) uint32_t Encode(size_t nblocks, const float* in, uint8_t* scales,
                                                uint8_t* codes) {
  uint32_t all = 0;
  const CodeThresholds<F> thresholds;
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
      __m256i code = MagnitudeCodes<F>(
          _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(a[k]), inv)), thresholds);
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
  return codec == Codec::kFp4E2M1 ? Encode<E2M1>(nblocks, in, scales, codes)
                                  : Encode<E3M0>(nblocks, in, scales, codes);
#else
  (void)codec, (void)nblocks, (void)in, (void)scales, (void)codes;
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
