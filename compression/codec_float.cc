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

const CodecTraits kFp32Codec = {.id = Codec::kFp32,
                                .name = "fp32",
                                .default_block = 0,
                                .min_block = 0,
                                .max_block = 0,
                                .block_multiple = 1,
                                .block_bytes = 0,
                                .element_bits = 32,
                                .encode = EncodeFp32,
                                .checks_finite = false,
                                .decode = DecodeFp32,
                                .stochastic_rounding = false,
                                .simd = false,
                                .cuda = true};
const CodecTraits kBf16Codec = {.id = Codec::kBf16,
                                .name = "bf16",
                                .default_block = 0,
                                .min_block = 0,
                                .max_block = 0,
                                .block_multiple = 1,
                                .block_bytes = 0,
                                .element_bits = 16,
                                .encode = EncodeBf16,
                                .checks_finite = false,
                                .decode = DecodeBf16,
                                .stochastic_rounding = true,
                                .simd = false,
                                .cuda = true};

}  // namespace atl::compression
