// int2: per block a float32 step q = amax / 3, then 2-bit codes (element i in byte i / 4, bits
// 2 (i mod 4) and up), decoding to (2c - 3) x q (codec_math.h). The value codec of the sparse
// pseudo-gradients (compression/codec_sparse.h); usable dense too, in blocks of a multiple of 4.
#include <cstring>
#include <vector>

#include "compression/codec_rows.h"
#include "compression/codec_simd.h"

namespace atl::compression {
namespace {

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

// Codes one per byte first (a loop the compiler vectorizes, or the AVX2 kernel for stochastic
// rounding), then four to a byte; blocks start on a byte (a multiple of 4, or the one block of a
// sparse chunk's values).
uint32_t EncodeInt2(uint32_t block, const float* in, size_t n, uint8_t* out,
                    const Rounding& rounding) {
  const size_t nblocks = (n + block - 1) / block;
  uint8_t* packed = out + 4 * nblocks;
  thread_local std::vector<uint8_t> codes;
  codes.resize(std::min<size_t>(block, n) + 3);
  uint32_t all = 0;
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float* x = in + first;
    const uint32_t amax_bits =
        simd::Enabled() ? simd::BlockAmaxBits(x, len) : AbsBits(BlockAmax(x, len));
    all = std::max(all, amax_bits);
    const float q = Int2Step(FromBits(amax_bits));
    std::memcpy(out + 4 * b, &q, 4);
    uint8_t* c = codes.data();
    if (rounding.stochastic) {
      const uint64_t base = rounding.first_index + first;
      size_t i = q > 0 && simd::Enabled()
                     ? simd::EncodeInt2Stochastic(x, len, q, rounding.seed, base, c)
                     : 0;
      for (; i < len; ++i) c[i] = Int2Stochastic(x[i], q, Uniform(rounding.seed, base + i));
    } else {
      for (size_t i = 0; i < len; ++i) c[i] = Int2Nearest(x[i], q);
    }
    c[len] = c[len + 1] = c[len + 2] = 0;
    uint8_t* dst = packed + first / 4;
    for (size_t i = 0; i < (len + 3) / 4; ++i) {
      dst[i] = uint8_t(c[4 * i] | (c[4 * i + 1] << 2) | (c[4 * i + 2] << 4) | (c[4 * i + 3] << 6));
    }
  }
  return all;
}

void DecodeInt2(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  const uint8_t* codes = in + 4 * nblocks;
  for (size_t b = lo / block; b * block < hi; ++b) {
    const size_t first = std::max(b * block, lo), last = std::min((b + 1) * block, hi);
    float q;
    std::memcpy(&q, in + 4 * b, 4);
    const float table[4] = {Int2Value(0, q), Int2Value(1, q), Int2Value(2, q), Int2Value(3, q)};
    for (size_t k = first; k < last; ++k) out[k - lo] = table[(codes[k / 4] >> (2 * (k % 4))) & 3u];
  }
}

}  // namespace

const CodecTraits kInt2Codec = {.id = Codec::kInt2,
                                .name = "int2",
                                .default_block = 64,
                                .min_block = 4,
                                .max_block = 65536,
                                .block_multiple = 4,
                                .block_bytes = 4,
                                .element_bits = 2,
                                .encode = EncodeInt2,
                                .checks_finite = true,
                                .decode = DecodeInt2,
                                .stochastic_rounding = true,
                                .simd = true,
                                .cuda = true};

}  // namespace atl::compression
