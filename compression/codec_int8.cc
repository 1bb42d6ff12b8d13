// int8: per block a float32 scale amax / 127, then the values as int8 codes q = rne(x / scale)
// (or stochastically rounded), x' = q x scale; a zero block has scale 0.
#include <cstring>

#include "compression/codec_rows.h"
#include "compression/codec_simd.h"

namespace atl::compression {
namespace {

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

uint32_t EncodeInt8(uint32_t block, const float* in, size_t n, uint8_t* out,
                    const Rounding& rounding) {
  const size_t nblocks = (n + block - 1) / block;
  int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nblocks);
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float amax = simd::Enabled() ? FromBits(simd::BlockAmaxBits(in + first, len)) : BlockAmax(in + first, len);
    const float scale = Int8Scale(amax);
    std::memcpy(out + 4 * b, &scale, 4);
    if (rounding.stochastic) {
      size_t i = 0;
      if (scale > 0 && simd::Enabled()) {
        i = simd::EncodeInt8Stochastic(in + first, len, scale, rounding.seed,
                                       rounding.first_index + first, q + first);
      }
      for (; i < len; ++i) {
        const uint64_t k = first + i;
        q[k] = Int8Stochastic(in[k], scale, Uniform(rounding.seed, rounding.first_index + k));
      }
    } else {
      for (size_t i = 0; i < len; ++i) q[first + i] = Int8Nearest(in[first + i], scale);
    }
  }
  return 0;
}

void DecodeInt8(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nblocks);
  for (size_t b = lo / block; b * block < hi; ++b) {
    const size_t first = std::max(b * block, lo), last = std::min((b + 1) * block, hi);
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    for (size_t k = first; k < last; ++k) out[k - lo] = float(q[k]) * scale;
  }
}

}  // namespace

const CodecTraits kInt8Codec = {.id = Codec::kInt8,
                                .name = "int8",
                                .default_block = 64,
                                .min_block = 1,
                                .max_block = 65536,
                                .block_multiple = 1,
                                .block_bytes = 4,
                                .element_bits = 8,
                                .encode = EncodeInt8,
                                .checks_finite = false,
                                .decode = DecodeInt8,
                                .stochastic_rounding = true,
                                .simd = false,
                                .cuda = true};

}  // namespace atl::compression
