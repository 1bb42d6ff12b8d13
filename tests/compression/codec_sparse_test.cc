// Sparse codecs (compression/codec_sparse.h): what top-k keeps, the byte layout, exact round
// trips, slices on the chunk grid, and the refusals of index lists no encoder writes.
#include "compression/codec_sparse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "compression/codec_simd.h"
#include "tests/compression/hard_input.h"

namespace atl::compression {
namespace {

using ::testing::HasSubstr;

CodecSpec Sparse(const char* values, uint32_t chunk, uint32_t k) {
  return *MakeSpec(int(ParseCodec(values)->codec), chunk, k);
}

// The reference: indices of the k largest magnitudes, ties to the lower index, ascending.
std::vector<uint32_t> ReferenceTopK(const float* x, uint32_t len, uint32_t k) {
  std::vector<uint32_t> order(len);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(std::min(k, len));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(SparseCodecTest, TopKKeepsTheLargestMagnitudesTiesToTheLowerIndex) {
  for (const bool vector : {true, false}) {
    simd::SetEnabledForTesting(vector);
    for (const uint32_t len : {1u, 7u, 64u, 1000u, 4096u}) {
      for (const uint32_t k : {1u, 3u, 41u, 500u}) {
        auto x = Normal(len, len + k);
        // Ties: repeated magnitudes of both signs, and a run of zeros.
        for (uint32_t i = 0; i < len; i += 5) x[i] = (i % 2 ? -1 : 1) * 0.02f;
        for (uint32_t i = 1; i < len; i += 7) x[i] = 0.0f;
        std::vector<uint32_t> idx(len);
        sparse::SelectTopK(x.data(), len, k, idx.data());
        idx.resize(std::min(k, len));
        EXPECT_EQ(idx, ReferenceTopK(x.data(), len, k)) << "len " << len << " k " << k;
      }
    }
    // The floor guessed from every 16th element is too high when the few large magnitudes all
    // sit on that stride: fewer than k pass it, and the histogram's floor decides.
    auto x = Normal(4096, 7);
    for (uint32_t i = 0; i < 20; ++i) x[size_t(i) * 16 * 7] = 100.0f + float(i);
    std::vector<uint32_t> idx(4096);
    sparse::SelectTopK(x.data(), 4096, 41, idx.data());
    idx.resize(41);
    EXPECT_EQ(idx, ReferenceTopK(x.data(), 4096, 41)) << "vector " << vector;
    std::vector<float> zeros(4096, 0.0f);
    sparse::SelectTopK(zeros.data(), 4096, 41, idx.data());
    for (uint32_t i = 0; i < 41; ++i) EXPECT_EQ(idx[i], i);
  }
  simd::SetEnabledForTesting(true);
}

// With fp32 values the payload is exact: the kept elements as they are, zeros elsewhere.
TEST(SparseCodecTest, RoundTripsAreExactWithFp32ValuesAndKeepTheSignWithInt2) {
  const size_t n = 10000;  // two whole chunks of 4096 and a short one of 1808
  const auto x = Normal(n, 3);
  for (const char* values : {"fp32", "int2", "fp4_e2m1", "int8"}) {
    SCOPED_TRACE(values);
    const CodecSpec spec = Sparse(values, 4096, 41);
    std::vector<uint8_t> bytes(EncodedBytes(spec, n) + 8, 0xA5);
    ASSERT_TRUE(Encode(spec, x.data(), n, bytes.data()).ok());
    for (size_t i = EncodedBytes(spec, n); i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0xA5);
    std::vector<float> y(n);
    ASSERT_TRUE(Decode(spec, bytes.data(), EncodedBytes(spec, n), n, y.data()).ok());
    for (size_t start = 0; start < n; start += 4096) {
      const uint32_t len = uint32_t(std::min<size_t>(4096, n - start));
      const auto kept = ReferenceTopK(x.data() + start, len, 41);
      std::vector<bool> is_kept(len, false);
      for (uint32_t i : kept) is_kept[i] = true;
      for (uint32_t i = 0; i < len; ++i) {
        const float got = y[start + i], want = x[start + i];
        if (!is_kept[i]) {
          ASSERT_EQ(got, 0.0f) << start + i;
        } else if (std::string(values) == "fp32") {
          ASSERT_EQ(got, want) << start + i;
        } else {
          ASSERT_NE(got, 0.0f) << start + i;
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << start + i;
        }
      }
    }
  }
}

// Bytes per chunk: the values' payload, then Elias-Fano indices: k low parts of
// floor(log2(L / k)) bits and k + ((L - 1) >> l) + 1 bits of high parts, padded to a byte.
TEST(SparseCodecTest, PayloadsHaveTheDocumentedSize) {
  // C 4096, k 41: l = 6; 246 + 41 + 64 = 351 bits = 44 bytes; int2 values 4 + 11 bytes.
  EXPECT_EQ(EncodedBytes(Sparse("int2", 4096, 41), 4096), 4u + 11u + 44u);
  // fp4 values: 1 scale byte + 21 bytes; two chunks and a short one of 100 (k 41, l 1:
  // 41 + 41 + 50 = 132 bits = 17 bytes).
  EXPECT_EQ(EncodedBytes(Sparse("fp4_e2m1", 4096, 41), 8292), 2 * (22u + 44u) + 22u + 17u);
  // A chunk shorter than k keeps all of it.
  EXPECT_EQ(EncodedBytes(Sparse("fp32", 64, 10), 5), 20u + (0u + 5 + 4 + 1 + 7) / 8);
  // 1% density at 2 bits: about 0.12 bits per element, a 270th of fp32.
  const double bits = 8.0 * double(EncodedBytes(Sparse("int2", 4096, 41), 4096 * 100)) / 409600.0;
  EXPECT_LT(bits, 0.12);
}

TEST(SparseCodecTest, SlicesOnTheChunkGridArePayloadsOfTheirOwn) {
  const CodecSpec spec = Sparse("int2", 256, 8);
  const size_t n = 2000;
  const auto x = Normal(n, 9);
  std::vector<uint8_t> bytes(EncodedBytes(spec, n));
  ASSERT_TRUE(Encode(spec, x.data(), n, bytes.data()).ok());
  std::vector<float> all(n);
  ASSERT_TRUE(Decode(spec, bytes.data(), bytes.size(), n, all.data()).ok());
  for (const auto& [a, b] : std::vector<std::pair<size_t, size_t>>{{0, 256}, {256, 2000}, {512, 1024}, {1792, 2000}}) {
    const SliceLayout s = SliceOf(spec, n, a, b);
    std::vector<uint8_t> part(bytes.begin() + long(s.blocks_offset),
                              bytes.begin() + long(s.blocks_offset + s.blocks_bytes));
    ASSERT_EQ(part.size(), EncodedBytes(spec, b - a));
    std::vector<float> y(b - a);
    ASSERT_TRUE(Decode(spec, part.data(), part.size(), b - a, y.data()).ok());
    for (size_t i = a; i < b; ++i) ASSERT_EQ(y[i - a], all[i]);
    // And a window of the whole payload decodes to the same.
    std::vector<float> w(b - a - 3);
    ASSERT_TRUE(DecodeSlice(spec, bytes.data(), bytes.size(), n, a + 3, w.size(), w.data()).ok());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], all[a + 3 + i]);
  }
}

TEST(SparseCodecTest, EncodingIsDeterministicAndStochasticRoundingFollowsTheSeed) {
  const CodecSpec spec = Sparse("int2", 4096, 123);
  const auto x = Normal(8192, 4);
  auto encode = [&](bool stochastic, uint64_t seed) {
    std::vector<uint8_t> out(EncodedBytes(spec, x.size()));
    EXPECT_TRUE(Encode(spec, x.data(), x.size(), out.data(), {stochastic, seed, 0}).ok());
    return out;
  };
  EXPECT_EQ(encode(false, 0), encode(false, 0));
  EXPECT_EQ(encode(true, 7), encode(true, 7));
  EXPECT_NE(encode(true, 7), encode(true, 8));
}

// int2's grid: -3q, -q, q, 3q with q = amax / 3; nearest rounding with ties to the even code.
TEST(SparseCodecTest, Int2DecodesToItsUniformGrid) {
  const CodecSpec spec = *MakeSpec(int(Codec::kInt2), 8);
  const std::vector<float> x = {3.0f, -3.0f, 0.0f, 2.0f, -2.0f, 0.9f, -1.1f, 2.1f};
  std::vector<uint8_t> bytes(EncodedBytes(spec, x.size()));
  ASSERT_EQ(bytes.size(), 4u + 2u);
  ASSERT_TRUE(Encode(spec, x.data(), x.size(), bytes.data()).ok());
  std::vector<float> y(x.size());
  ASSERT_TRUE(Decode(spec, bytes.data(), bytes.size(), x.size(), y.data()).ok());
  EXPECT_EQ(y, (std::vector<float>{3.0f, -3.0f, 1.0f, 1.0f, -3.0f, 1.0f, -1.0f, 3.0f}));
  // Stochastic rounding is unbiased between the levels.
  std::vector<float> v(4096, 0.4f);
  v[0] = 3.0f;  // q = 1
  std::vector<uint8_t> sr(EncodedBytes(spec, v.size()));
  double sum = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    ASSERT_TRUE(Encode(spec, v.data(), v.size(), sr.data(), {true, seed, 0}).ok());
    std::vector<float> back(v.size());
    ASSERT_TRUE(Decode(spec, sr.data(), sr.size(), v.size(), back.data()).ok());
    for (size_t b = 1; b < 8; ++b) sum += back[b];  // the first block, q = 1
  }
  EXPECT_NEAR(sum / (20 * 7), 0.4, 0.2);
}

// Hand-made index lists (values fp32, chunk 64, k 4: l = 4, 16 low bits then 8 high bits).
std::vector<uint8_t> Payload(const std::vector<uint32_t>& indices, int extra_high_bit = -1) {
  std::vector<uint8_t> p(4 * 4 + 3, 0);
  for (size_t i = 0; i < 4; ++i) {
    const float v = 1.0f + float(i);
    std::memcpy(p.data() + 4 * i, &v, 4);
  }
  uint32_t bits = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    bits |= (indices[i] & 15u) << (4 * i);
    bits |= 1u << (16 + (indices[i] >> 4) + i);
  }
  if (extra_high_bit >= 0) bits |= 1u << (16 + extra_high_bit);
  p[16] = uint8_t(bits);
  p[17] = uint8_t(bits >> 8);
  p[18] = uint8_t(bits >> 16);
  return p;
}

TEST(SparseCodecTest, DecodingRefusesIndexListsNoEncoderWrites) {
  const CodecSpec spec = Sparse("fp32", 64, 4);
  ASSERT_EQ(EncodedBytes(spec, 64), 19u);
  std::vector<float> y(64);
  auto decode = [&](const std::vector<uint8_t>& p) {
    return Decode(spec, p.data(), p.size(), 64, y.data());
  };
  ASSERT_TRUE(decode(Payload({1, 17, 40, 63})).ok());
  EXPECT_EQ(y[17], 2.0f);
  EXPECT_EQ(y[63], 4.0f);
  EXPECT_EQ(y[0], 0.0f);
  const struct {
    std::vector<uint8_t> payload;
    const char* message;
  } bad[] = {
      {Payload({1, 17, 17, 63}), "index 17 follows 17"},
      {Payload({1, 20, 17, 63}), "index 17 follows 20 (indices must be ascending and distinct)"},
      {Payload({1, 17, 40}), "ends after 3 indices"},
      {Payload({1, 17, 40, 63}, 7), "more indices than kept"},
  };
  for (const auto& b : bad) {
    const auto s = decode(b.payload);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(b.message));
    EXPECT_THAT(std::string(s.message()), HasSubstr("sparse chunk 0"));
  }
  // Past the chunk: in a short last chunk of 50 elements (l = 3, 12 low bits, 4 + 7 high bits).
  const CodecSpec short_spec = Sparse("fp32", 64, 4);
  std::vector<uint8_t> p(16 + 3, 0);
  uint32_t bits = 0;
  const uint32_t idx[4] = {1, 2, 3, 55};
  for (uint32_t i = 0; i < 4; ++i) {
    bits |= (idx[i] & 7u) << (3 * i);
    bits |= 1u << (12 + (idx[i] >> 3) + i);
  }
  std::memcpy(p.data() + 16, &bits, 3);
  ASSERT_EQ(EncodedBytes(short_spec, 50), 19u);
  const auto s = Decode(short_spec, p.data(), p.size(), 50, y.data());
  EXPECT_THAT(std::string(s.message()), HasSubstr("index 55 is outside the chunk"));
  // Wrong sizes are named.
  const auto sized = Decode(spec, p.data(), 18, 64, y.data());
  EXPECT_THAT(std::string(sized.message()), HasSubstr("must be 19 bytes, got 18"));
}

TEST(SparseCodecTest, SpecsAreCheckedByName) {
  EXPECT_TRUE(MakeSpec(int(Codec::kInt2), 4096, 41).ok());
  EXPECT_THAT(std::string(MakeSpec(int(Codec::kInt2), 8192, 41).status().message()),
              HasSubstr("chunk of 8192 elements is invalid (1..4096)"));
  EXPECT_THAT(std::string(MakeSpec(int(Codec::kInt2), 32, 33).status().message()),
              HasSubstr("keeps 33 values of chunks of 32"));
  EXPECT_EQ(SpecText(Sparse("int2", 4096, 41)), "top-41/4096 int2");
  EXPECT_EQ(SpecText(*ParseCodec("int2")), "int2");
}

TEST(SparseCodecTest, NonFiniteInputIsRefusedNamingTheElement) {
  const CodecSpec spec = Sparse("int2", 64, 4);
  std::vector<float> x = Normal(200, 1);
  x[130] = NAN;
  std::vector<uint8_t> out(EncodedBytes(spec, x.size()));
  const auto s = Encode(spec, x.data(), x.size(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("at element 130"));
}

// A sparse input encodes to Encode's very bytes in time proportional to its values: fewer nonzeros
// than kept (zeros of both signs among them, which count as zeros), more than kept (the selection
// decides), a short last chunk; what it hands over as written is what VisitKept reads back, and
// VisitKept over any range is DecodeSlice's nonzeros there plus the kept zeros.
TEST(SparseCodecTest, SparseInputEncodesAsDenseAndKeptValuesReadBack) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (const CodecSpec spec : {CodecSpec{Codec::kFp4E2M1, 256, 20}, CodecSpec{Codec::kInt2, 256, 3},
                               CodecSpec{Codec::kFp32, 64, 64}}) {
    SCOPED_TRACE(SpecText(spec));
    const size_t n = 1000;  // 3 whole chunks and a short one
    std::vector<float> dense(n, 0.0f);
    std::vector<uint32_t> index;
    std::vector<float> values;
    for (uint32_t i = 0; i < n; ++i) {
      // Chunk 1 holds more nonzeros than kept; -0 and +0 entries appear elsewhere.
      const bool held = (i / 256 == 1) ? i % 3 == 0 : i % 29 == 0 || i % 31 == 0;
      if (!held) continue;
      const float v = i % 58 == 0 ? -0.0f : i % 62 == 0 ? 0.0f : value(rng);
      dense[i] = v;
      index.push_back(i);
      values.push_back(v);
    }
    std::vector<uint8_t> want(EncodedBytes(spec, n)), got(want.size());
    ASSERT_TRUE(Encode(spec, dense.data(), n, want.data()).ok());
    std::vector<uint32_t> written_index;
    std::vector<float> written;
    const KeptVisitor collect = [&](size_t base, const uint32_t* at, const float* v, size_t m) {
      for (size_t j = 0; j < m; ++j) written_index.push_back(uint32_t(base + at[j]));
      written.insert(written.end(), v, v + m);
    };
    ASSERT_TRUE(EncodeSparseInput(spec, n, index.data(), values.data(), index.size(), got.data(),
                                  {}, &collect)
                    .ok());
    EXPECT_EQ(got, want);
    std::vector<uint32_t> read_index;
    std::vector<float> read;
    ASSERT_TRUE(DecodeKept(spec, got.data(), got.size(), n, 0, n, &read_index, &read).ok());
    EXPECT_EQ(written_index, read_index);
    EXPECT_EQ(written, read);
    for (const auto& [first, count] :
         std::vector<std::pair<size_t, size_t>>{{0, n}, {100, 300}, {255, 2}, {999, 1}}) {
      std::vector<float> slice(count);
      ASSERT_TRUE(DecodeSlice(spec, got.data(), got.size(), n, first, count, slice.data()).ok());
      std::vector<float> rebuilt(count, 0.0f);
      ASSERT_TRUE(VisitKept(spec, got.data(), got.size(), n, first, count,
                            [&](size_t base, const uint32_t* at, const float* v, size_t m) {
                              for (size_t j = 0; j < m; ++j) {
                                ASSERT_GE(base + at[j], first);
                                ASSERT_LT(base + at[j], first + count);
                                rebuilt[base + at[j] - first] = v[j];
                              }
                            })
                      .ok());
      EXPECT_EQ(0, std::memcmp(rebuilt.data(), slice.data(), count * sizeof(float)))
          << "[" << first << ", " << first + count << ")";
    }
  }
  // Dense specs and unordered indices are refused by name.
  const uint32_t unordered[] = {5, 3};
  const float two[] = {1.0f, 2.0f};
  std::vector<uint8_t> out(EncodedBytes({Codec::kInt2, 256, 3}, 10));
  EXPECT_THAT(std::string(EncodeSparseInput({Codec::kInt2, 256, 3}, 10, unordered, two, 2,
                                            out.data())
                              .message()),
              ::testing::HasSubstr("not ascending"));
  EXPECT_THAT(std::string(VisitKept({Codec::kFp4E2M1, 32}, out.data(), 0, 0, 0, 0, nullptr).message()),
              ::testing::HasSubstr("sparse codec"));
}

}  // namespace
}  // namespace atl::compression
