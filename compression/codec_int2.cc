// int2: per block a float32 step q = amax / 3, then 2-bit codes (element i in byte i / 4, bits
// 2 (i mod 4) and up), decoding to (2c - 3) x q (codec_math.h). The value codec of the sparse
// pseudo-gradients (compression/codec_sparse.h); usable dense too, in blocks of a multiple of 4.
//
// int2_centroid: the same codes, decoding through a table of 4 float32 levels per block: the
// means of the block's values in 4 bins cut at -t, 0 and t, t the block's mean magnitude (as
// Templar's SparseLoCo decodes 2-bit values to bin means, not to a uniform grid). A top-k
// selection keeps magnitudes well above the rest, so a uniform grid over [-amax, amax] puts most
// of them on +-amax/3; the bin means follow where they lie, and each bin's sum is kept. An empty
// bin's level is its edge nearer zero, so a table is always -inf < t0 <= t1 <= 0 <= t2 <= t3 <
// inf; any other table is refused as malformed.
#include <cmath>
#include <cstring>
#include <vector>

#include "compression/codec_rows.h"
#include "compression/codec_simd.h"

namespace atl::compression {
namespace {

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

// Packs one code per byte c[0, len) four to a byte into dst (c has room for 3 more, zeroed here).
void PackCodes(uint8_t* c, size_t len, uint8_t* dst) {
  c[len] = c[len + 1] = c[len + 2] = 0;
  for (size_t i = 0; i < (len + 3) / 4; ++i) {
    dst[i] = uint8_t(c[4 * i] | (c[4 * i + 1] << 2) | (c[4 * i + 2] << 4) | (c[4 * i + 3] << 6));
  }
}

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
    PackCodes(c, len, packed + first / 4);
  }
  return all;
}

// Elements [lo, hi) of a 2-bit payload whose blocks start with `header` bytes that table_of turns
// into the block's 4 levels.
template <size_t header, typename TableOf>
void DecodeCodes(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out,
                 TableOf table_of) {
  const size_t nblocks = (n + block - 1) / block;
  const uint8_t* codes = in + header * nblocks;
  for (size_t b = lo / block; b * block < hi; ++b) {
    const size_t first = std::max(b * block, lo), last = std::min((b + 1) * block, hi);
    float table[4];
    table_of(in + header * b, table);
    for (size_t k = first; k < last; ++k) out[k - lo] = table[(codes[k / 4] >> (2 * (k % 4))) & 3u];
  }
}

void DecodeInt2(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out) {
  DecodeCodes<4>(block, in, n, lo, hi, out, [](const uint8_t* h, float* table) {
    float q;
    std::memcpy(&q, h, 4);
    for (uint8_t c = 0; c < 4; ++c) table[c] = Int2Value(c, q);
  });
}

// The bin of x among those cut at -t, 0 and t: 0 below -t, 1 in [-t, 0), 2 in [0, t), 3 from t.
inline uint8_t CentroidBin(float x, float t) {
  return uint8_t(int(x >= -t) + int(x >= 0.0f) + int(x >= t));
}

uint32_t EncodeInt2Centroid(uint32_t block, const float* in, size_t n, uint8_t* out,
                            const Rounding&) {
  const size_t nblocks = (n + block - 1) / block;
  uint8_t* packed = out + 16 * nblocks;
  thread_local std::vector<uint8_t> codes;
  codes.resize(std::min<size_t>(block, n) + 3);
  uint32_t all = 0;
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float* x = in + first;
    const uint32_t amax_bits =
        simd::Enabled() ? simd::BlockAmaxBits(x, len) : AbsBits(BlockAmax(x, len));
    all = std::max(all, amax_bits);
    if (amax_bits >= 0x7F800000u) return all;  // not finite: the caller refuses the input
    // The edge t: the mean magnitude, in double in element order.
    double magnitude = 0;
    for (size_t i = 0; i < len; ++i) magnitude += std::fabs(double(x[i]));
    const float t = float(magnitude / double(len));
    // Each value's bin, and the bins' sums and counts.
    double sum[4] = {0, 0, 0, 0};
    size_t count[4] = {0, 0, 0, 0};
    uint8_t* c = codes.data();
    for (size_t i = 0; i < len; ++i) {
      c[i] = CentroidBin(x[i], t);
      sum[c[i]] += double(x[i]);
      ++count[c[i]];
    }
    const float edge[4] = {-t, 0.0f, 0.0f, t};
    float table[4];
    for (int k = 0; k < 4; ++k) table[k] = count[k] ? float(sum[k] / double(count[k])) : edge[k];
    std::memcpy(out + 16 * b, table, 16);
    PackCodes(c, len, packed + first / 4);
  }
  return all;
}

void DecodeInt2Centroid(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi,
                        float* out) {
  DecodeCodes<16>(block, in, n, lo, hi, out,
                  [](const uint8_t* h, float* table) { std::memcpy(table, h, 16); });
}

const char* MalformedCentroidTable(uint32_t block, const uint8_t* in, size_t /*n*/, size_t lo,
                                   size_t hi, size_t* bad) {
  for (size_t b = lo / block; b * block < hi; ++b) {
    float t[4];
    std::memcpy(t, in + 16 * b, 16);
    if (!(std::isfinite(t[0]) && std::isfinite(t[3]) && t[0] <= t[1] && t[1] <= 0.0f &&
          0.0f <= t[2] && t[2] <= t[3])) {
      *bad = b;
      return "its 4 levels must be finite and ascending, the second at most 0, the third at "
             "least 0";
    }
  }
  return nullptr;
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

const CodecTraits kInt2CentroidCodec = {.id = Codec::kInt2Centroid,
                                        .name = "int2_centroid",
                                        .default_block = 256,
                                        .min_block = 4,
                                        .max_block = 65536,
                                        .block_multiple = 4,
                                        .block_bytes = 16,
                                        .element_bits = 2,
                                        .encode = EncodeInt2Centroid,
                                        .checks_finite = true,
                                        .decode = DecodeInt2Centroid,
                                        .malformed_block = MalformedCentroidTable,
                                        .stochastic_rounding = false,
                                        .simd = false,
                                        .cuda = false};

}  // namespace atl::compression
