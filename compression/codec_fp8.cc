// fp8_e4m3 (MXFP8, the OCP microscaling format): per block an E8M0 scale byte (2^(byte - 127)),
// scale = 2^(floor(log2 amax) - 8) so the block's largest magnitude lands in [256, 512) before
// saturating at 448; then one E4M3 byte per element: bit 7 the sign, bits 3-6 the exponent (bias
// 7), bits 0-2 the mantissa. Magnitudes: code c < 8 is c x 2^-9 (subnormal), else
// (1 + (c & 7) / 8) x 2^((c >> 3) - 7), the largest 448 (code 0x7E); 0x7F is NaN in E4M3 and
// never written (a payload holding it decodes to a non-finite value and is refused). Rounding is to
// nearest, ties to the even code, or stochastic (unbiased between neighbouring codes); values past
// 448 x scale saturate; a value that rounds to zero is +0.
#include <cmath>

#include "compression/codec_rows.h"

namespace atl::compression {
namespace {

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

constexpr int kScaleOffset = 8;    // floor(log2 448)
constexpr int kMaxCode = 0x7E;     // 448
constexpr float kSubnormalStep = 1.0f / 512.0f;  // 2^-9

float Magnitude(int c) {
  if (c < 8) return float(c) * kSubnormalStep;
  return (1.0f + float(c & 7) * 0.125f) * Pow2((c >> 3) - 7);
}

// The largest code whose magnitude is <= v (v >= 0, finite), at most kMaxCode.
int Floor(float v) {
  if (v < 0.015625f) return int(v * 512.0f);  // below 2^-6: exact multiples of 2^-9
  const int exponent = FloorLog2(v) + 7;
  if (exponent > 15) return kMaxCode;
  const int code = (exponent << 3) | int((Bits(v) >> 20) & 7u);
  return code > kMaxCode ? kMaxCode : code;
}

// Nearest, ties to the even code: the midpoint of two neighbouring magnitudes is exact (they have
// at most four significant bits).
int Nearest(float v) {
  const int c = Floor(v);
  if (c >= kMaxCode) return kMaxCode;
  const float mid = 0.5f * (Magnitude(c) + Magnitude(c + 1));
  return c + int(v > mid || (v == mid && (c & 1)));
}

// Up with probability (v - lo) / (hi - lo): the gap is a power of two and v - lo exact.
int Stochastic(float v, float r) {
  const int c = Floor(v);
  if (c >= kMaxCode) return kMaxCode;
  const float lo = Magnitude(c), gap = Magnitude(c + 1) - lo;
  return c + int(r * gap < v - lo);
}

int ScaleExponent(float amax) {
  const int e = amax > 0 ? FloorLog2(amax) - kScaleOffset : -127;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

uint32_t EncodeFp8(uint32_t block, const float* in, size_t n, uint8_t* out,
                   const Rounding& rounding) {
  const size_t nblocks = (n + block - 1) / block;
  uint8_t* codes = out + nblocks;
  uint32_t all = 0;
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float amax = BlockAmax(in + first, len);
    all = std::max(all, AbsBits(amax));
    if (!IsFinite(amax)) continue;  // refused by the caller: nothing of it is valid
    const int e = ScaleExponent(amax);
    out[b] = uint8_t(e + 127);
    const float inv = Pow2(-e);
    for (size_t i = 0; i < len; ++i) {
      const float x = in[first + i];
      const float v = FromBits(AbsBits(x)) * inv;
      const int c = rounding.stochastic
                        ? Stochastic(v, Uniform(rounding.seed, rounding.first_index + first + i))
                        : Nearest(v);
      codes[first + i] = uint8_t(c | (c != 0 ? int(Bits(x) >> 31) << 7 : 0));
    }
  }
  return all;
}

// The 128 magnitudes, unscaled; NaN for 0x7F.
struct Magnitudes {
  float m[128];
  Magnitudes() {
    for (int c = 0; c < 128; ++c) m[c] = c == 0x7F ? NAN : Magnitude(c);
  }
};

void DecodeFp8(uint32_t block, const uint8_t* in, size_t n, size_t first, size_t last,
               float* out) {
  static const Magnitudes table;
  const size_t nblocks = (n + block - 1) / block;
  const uint8_t* codes = in + nblocks;
  for (size_t b = first / block; b * block < last; ++b) {
    const size_t lo = std::max(b * block, first), hi = std::min((b + 1) * block, last);
    const float scale = Pow2(int(in[b]) - 127);
    for (size_t k = lo; k < hi; ++k) {
      const float v = table.m[codes[k] & 0x7F] * scale;
      out[k - first] = (codes[k] & 0x80) ? -v : v;
    }
  }
}

}  // namespace

const CodecTraits kFp8E4M3Codec = {.id = Codec::kFp8E4M3,
                                   .name = "fp8_e4m3",
                                   .default_block = 32,
                                   .min_block = 1,
                                   .max_block = 4096,
                                   .block_multiple = 1,
                                   .block_bytes = 1,
                                   .element_bits = 8,
                                   .encode = EncodeFp8,
                                   .checks_finite = true,
                                   .decode = DecodeFp8,
                                   .stochastic_rounding = true,
                                   .simd = false,
                                   .cuda = false};

}  // namespace atl::compression
