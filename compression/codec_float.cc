// fp32 (the values as they are) and bf16 (the top 16 bits of float32, rounded to nearest even or
// stochastically).
#include <cstring>

#include "compression/codec_rows.h"
#include "compression/codec_simd.h"

namespace atl::compression {
namespace {

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

uint32_t EncodeFp32(uint32_t, const float* in, size_t n, uint8_t* out, const Rounding&) {
  std::memcpy(out, in, n * 4);
  return 0;
}

void DecodeFp32(uint32_t, const uint8_t* in, size_t, size_t first, size_t last, float* out) {
  std::memcpy(out, in + 4 * first, 4 * (last - first));
}

uint32_t EncodeBf16(uint32_t, const float* in, size_t n, uint8_t* out, const Rounding& rounding) {
  if (rounding.stochastic) {
    const size_t done =
        simd::Enabled() ? simd::EncodeBf16Stochastic(in, n, rounding.seed, rounding.first_index, out) : 0;
    for (size_t i = done; i < n; ++i) {
      const uint16_t h = Bf16Stochastic(in[i], rounding.seed, rounding.first_index + i);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return 0;
  }
  for (size_t i = 0; i < n; ++i) {  // a separate loop, so that the compiler vectorizes it
    const uint16_t h = Bf16Nearest(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
  return 0;
}

void DecodeBf16Span(const uint8_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Bf16Value(h);
  }
}

void DecodeBf16(uint32_t, const uint8_t* in, size_t, size_t first, size_t last, float* out) {
  DecodeBf16Span(in + 2 * first, last - first, out);
}

}  // namespace

const CodecTraits kFp32Codec = {Codec::kFp32, "fp32", 0, 0, 0, 1, 0, 32, EncodeFp32, false,
                                DecodeFp32, false, false, true};
const CodecTraits kBf16Codec = {Codec::kBf16, "bf16", 0, 0, 0, 1, 0, 16, EncodeBf16, false,
                                DecodeBf16, true, false, true};

}  // namespace atl::compression
