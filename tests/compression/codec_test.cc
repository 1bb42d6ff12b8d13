#include "compression/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/codec_simd.h"
#include "tests/compression/hard_input.h"

namespace atl::compression {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Enc(CodecSpec spec, const std::vector<float>& x, const Rounding& rounding = {}) {
  std::vector<uint8_t> out(EncodedBytes(spec, x.size()));
  auto s = Encode(spec, x.data(), x.size(), out.data(), rounding);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<float> Dec(CodecSpec spec, const std::vector<uint8_t>& b, size_t n) {
  std::vector<float> out(n);
  auto s = Decode(spec, b.data(), b.size(), n, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

const CodecSpec kE2M1{Codec::kFp4E2M1, 32};
const CodecSpec kE3M0{Codec::kFp4E3M0, 32};

// The vector kernels (AVX2) against the scalar code: the same bytes from Encode, the same bits from
// Decode and DecodeSlice, on inputs that exercise every rounding and saturation rule, for sizes
// with and without a partial last block and slices that start and end inside blocks.
TEST(CodecTest, VectorKernelsEqualTheScalarCodeBitForBit) {
  if (!simd::Enabled()) GTEST_SKIP() << "this CPU has no AVX2: only the scalar code runs";
  struct Restore {
    ~Restore() { simd::SetEnabledForTesting(true); }
  } restore;
  std::mt19937 rng(7);
  for (const CodecSpec spec : {kE2M1, kE3M0}) {
    for (const size_t n : {size_t(1), size_t(32), size_t(33), size_t(1000), size_t(65536 + 17)}) {
      const auto x = HardInput(n, uint32_t(n) + uint32_t(spec.codec));
      simd::SetEnabledForTesting(false);
      const auto scalar = Enc(spec, x);
      simd::SetEnabledForTesting(true);
      ASSERT_EQ(Enc(spec, x), scalar) << CodecName(spec.codec) << " n=" << n;
      // Stochastic rounding draws the same numbers for the same elements: a seed, and a payload
      // that starts at an element index past 2^32 (the draws' counter wraps as the scalar one's).
      for (const Rounding r : {Rounding{true, 7, 0}, Rounding{true, 0xDEADBEEFCAFEull, (1ull << 33) + 5}}) {
        simd::SetEnabledForTesting(false);
        const auto scalar_sr = Enc(spec, x, r);
        simd::SetEnabledForTesting(true);
        ASSERT_EQ(Enc(spec, x, r), scalar_sr) << CodecName(spec.codec) << "+sr n=" << n;
        if (n >= 1000) {
          ASSERT_NE(scalar_sr, scalar) << "stochastic rounding moved no code";
        }
      }
      for (int trial = 0; trial < 20; ++trial) {
        const size_t first = trial == 0 ? 0 : rng() % n;
        const size_t count = trial == 0 ? n : 1 + rng() % (n - first);
        std::vector<float> a(count), b(count);
        simd::SetEnabledForTesting(false);
        ASSERT_TRUE(DecodeSlice(spec, scalar.data(), scalar.size(), n, first, count, a.data()).ok());
        simd::SetEnabledForTesting(true);
        ASSERT_TRUE(DecodeSlice(spec, scalar.data(), scalar.size(), n, first, count, b.data()).ok());
        ASSERT_EQ(std::memcmp(a.data(), b.data(), count * 4), 0)
            << CodecName(spec.codec) << " n=" << n << " [" << first << ", +" << count << ")";
      }
    }
  }
  // int8 (its block maxima), int2 and stochastic int8, int2 (dense and as sparse values) and bf16
  // take vector kernels too: the same bytes
  // as the scalar code, with
  // partial blocks, an all-zero block (scale 0) and bf16's saturation near FLT_MAX.
  for (const CodecSpec spec : {CodecSpec{Codec::kInt8, 64}, CodecSpec{Codec::kInt8, 100},
                               CodecSpec{Codec::kBf16, 0}, CodecSpec{Codec::kInt2, 64},
                               CodecSpec{Codec::kInt2, 4096, 41}}) {
    for (const size_t n : {size_t(7), size_t(64), size_t(1000), size_t(65536 + 17)}) {
      auto x = HardInput(n, uint32_t(n) + 99);
      for (size_t i = 0; i < std::min<size_t>(n, 64); ++i) x[i] = 0;  // a zero block
      if (n > 100) x[100] = 3.4028234e38f, x[101] = -3.4028230e38f;
      for (const Rounding r : {Rounding{}, Rounding{true, 11, 0}, Rounding{true, 0xFEEDull, (1ull << 35) + 3}}) {
        simd::SetEnabledForTesting(false);
        const auto scalar = Enc(spec, x, r);
        simd::SetEnabledForTesting(true);
        ASSERT_EQ(Enc(spec, x, r), scalar) << CodecName(spec.codec) << "+sr n=" << n;
      }
    }
  }
  // Every code under every scale byte whose codes all decode to finite values (0..252).
  for (const CodecSpec spec : {kE2M1, kE3M0}) {
    std::vector<uint8_t> payload;
    const size_t nblocks = 253;
    for (size_t b = 0; b < nblocks; ++b) payload.push_back(uint8_t(b));
    for (size_t i = 0; i < nblocks * 16; ++i) payload.push_back(uint8_t(rng()));
    std::vector<float> a(nblocks * 32), b(nblocks * 32);
    simd::SetEnabledForTesting(false);
    const auto sa = Decode(spec, payload.data(), payload.size(), a.size(), a.data());
    simd::SetEnabledForTesting(true);
    const auto sb = Decode(spec, payload.data(), payload.size(), b.size(), b.data());
    ASSERT_TRUE(sa.ok()) << sa;
    ASSERT_TRUE(sb.ok()) << sb;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  }
}

TEST(CodecTest, E2M1DecodesAll16Codes) {
  // Scale byte 127 = 2^0; codes 0..15 in order, two per byte, low nibble first.
  std::vector<uint8_t> b = {127};
  for (int c = 0; c < 16; c += 2) b.push_back(uint8_t(c | ((c + 1) << 4)));
  const auto v = Dec(kE2M1, b, 16);
  const std::vector<float> want = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(v[c], want[c]) << "code " << c;
    EXPECT_EQ(std::signbit(v[c]), c >= 8) << "code " << c;
  }
}

TEST(CodecTest, E2M1GoldenBytesAndTiesToEven) {
  const CodecSpec spec{Codec::kFp4E2M1, 4};
  // amax 6 -> scale 2^(2 - 2) = 1 -> byte 127; codes 2, 8|1, 5, 7.
  EXPECT_EQ(Enc(spec, {1.0f, -0.5f, 3.0f, 6.0f}), (std::vector<uint8_t>{0x7F, 0x92, 0x75}));
  // Every midpoint goes to the even code.
  const std::vector<float> ties = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  const std::vector<float> want = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f};
  EXPECT_EQ(Dec({Codec::kFp4E2M1, 8}, Enc({Codec::kFp4E2M1, 8}, ties), 8), want);
  // Just off the midpoints, to the nearer side.
  EXPECT_EQ(Dec(spec, Enc(spec, {0.2500001f, 1.2500001f, 4.9999995f, 6.0f}), 4),
            (std::vector<float>{0.5f, 1.5f, 4.0f, 6.0f}));
  // amax 7: scale 2^(2 - 2) = 1 and 7 saturates to 6; -0.1 rounds to +0.
  EXPECT_EQ(Dec(spec, Enc(spec, {7.0f, -0.1f, 0.0f, -0.0f}), 4),
            (std::vector<float>{6.0f, 0.0f, 0.0f, 0.0f}));
  EXPECT_FALSE(std::signbit(Dec(spec, Enc(spec, {7.0f, -0.1f, 0.0f, -0.0f}), 4)[1]));
}

TEST(CodecTest, E2M1BlockScalesZeroBlocksAndSubnormals) {
  const CodecSpec spec{Codec::kFp4E2M1, 2};
  // Per-block scales: 1024 -> 2^(10 - 2) -> byte 135; a zero block -> byte 0; 3 * 2^-128
  // (subnormal) -> scale clamped to 2^-127 -> code 3 (1.5), decoded exactly.
  const float sub = 3.0f * std::ldexp(1.0f, -128);
  const auto b = Enc(spec, {1024.0f, 256.0f, 0.0f, 0.0f, sub, 0.0f});
  EXPECT_EQ(b[0], 135);
  EXPECT_EQ(b[1], 0);
  EXPECT_EQ(b[2], 0);
  const auto v = Dec(spec, b, 6);
  EXPECT_EQ(v[0], 1024.0f);
  EXPECT_EQ(v[1], 256.0f);
  EXPECT_EQ(v[2], 0.0f);
  EXPECT_EQ(v[4], sub);
  // Odd element counts pack the last code into a low nibble.
  EXPECT_EQ(EncodedBytes(spec, 5), 3u + 3u);
}

TEST(CodecTest, E3M0GoldenBytesAndTies) {
  const CodecSpec spec{Codec::kFp4E3M0, 4};
  // amax 1.5 -> scale 2^0; 1 -> code 6; -0.25 -> 8|4; 1.5 ties 1 (6) vs 2 (7) -> 6;
  // 0.75 ties 0.5 (5) vs 1 (6) -> 6.
  EXPECT_EQ(Enc(spec, {1.0f, -0.25f, 1.5f, 0.75f}), (std::vector<uint8_t>{0x7F, 0xC6, 0x66}));
  std::vector<uint8_t> all = {127};
  for (int c = 0; c < 16; c += 2) all.push_back(uint8_t(c | ((c + 1) << 4)));
  const auto v = Dec({Codec::kFp4E3M0, 16}, all, 16);
  const std::vector<float> want = {0,     0.03125f,  0.0625f, 0.125f, 0.25f, 0.5f, 1, 2,
                                   -0.0f, -0.03125f, -0.0625f, -0.125f, -0.25f, -0.5f, -1, -2};
  EXPECT_EQ(v, want);
  // Below half of the smallest power of two rounds to zero; exactly half ties to zero.
  EXPECT_EQ(Dec(spec, Enc(spec, {1.0f, 0.015625f, 0.0156251f, 0.01f}), 4),
            (std::vector<float>{1.0f, 0.0f, 0.03125f, 0.0f}));
}

TEST(CodecTest, Int8AndBf16Golden) {
  const CodecSpec i8{Codec::kInt8, 4};
  // amax 127 -> scale 1.0 (0x3F800000); 0.5 rounds to even 0.
  EXPECT_EQ(Enc(i8, {1.0f, -2.0f, 0.5f, 127.0f}),
            (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3F, 0x01, 0xFE, 0x00, 0x7F}));
  EXPECT_EQ(Dec(i8, Enc(i8, {0, 0, 0, 0}), 4), (std::vector<float>{0, 0, 0, 0}));
  const CodecSpec bf{Codec::kBf16, 0};
  // 1 + 2^-8 ties to 1 (even); 1 + 3 * 2^-8 ties up to 1 + 2^-6 (even); 1 + 2^-8 + 2^-20 rounds up.
  const auto b = Enc(bf, {1.0f, 1.00390625f, 1.01171875f, 1.0039072f});
  EXPECT_EQ(b, (std::vector<uint8_t>{0x80, 0x3F, 0x80, 0x3F, 0x82, 0x3F, 0x81, 0x3F}));
}

TEST(CodecTest, RoundTripErrorBounds) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> x(4096);
  for (auto& v : x) v = normal(rng);
  struct Case {
    CodecSpec spec;
    double max_rel_rms;
  } cases[] = {{{Codec::kFp32, 0}, 0.0}, {{Codec::kBf16, 0}, 0.004}, {{Codec::kInt8, 64}, 0.02},
               {kE2M1, 0.15},            {kE3M0, 0.25}};
  for (const auto& c : cases) {
    const auto y = Dec(c.spec, Enc(c.spec, x), x.size());
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += double(y[i] - x[i]) * double(y[i] - x[i]);
      ref += double(x[i]) * x[i];
      // Per element: never more than half the block's largest magnitude off, never a sign flip.
      EXPECT_FALSE(y[i] != 0 && std::signbit(y[i]) != std::signbit(x[i]));
    }
    EXPECT_LE(std::sqrt(err / ref), c.max_rel_rms) << CodecName(c.spec.codec);
  }
  // Per-element bounds of the block codecs.
  const auto y8 = Dec({Codec::kInt8, 64}, Enc({Codec::kInt8, 64}, x), x.size());
  const auto y4 = Dec(kE2M1, Enc(kE2M1, x), x.size());
  for (size_t b = 0; b < x.size(); b += 64) {
    float amax = 0;
    for (size_t i = b; i < b + 64; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b; i < b + 64; ++i) EXPECT_LE(std::fabs(y8[i] - x[i]), amax / 254 * 1.0001f);
  }
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b; i < b + 32; ++i) EXPECT_LE(std::fabs(y4[i] - x[i]), amax / 4);
  }
}

// Mean of the decoded value of element 1 over many blocks [anchor, v, v, ...] of `block` elements.
double StochasticMean(CodecSpec spec, float anchor, float v, std::vector<float>* seen) {
  const size_t block = std::max<uint32_t>(spec.block_size, 2), blocks = 20000;
  std::vector<float> x(block * blocks, v);
  for (size_t b = 0; b < blocks; ++b) x[b * block] = anchor;
  std::vector<uint8_t> out(EncodedBytes(spec, x.size()));
  EXPECT_TRUE(Encode(spec, x.data(), x.size(), out.data(), {true, 99, 0}).ok());
  const auto y = Dec(spec, out, x.size());
  double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (i % block == 0) continue;
    sum += y[i];
    ++count;
    if (std::find(seen->begin(), seen->end(), y[i]) == seen->end()) seen->push_back(y[i]);
  }
  return sum / double(count);
}

TEST(CodecTest, StochasticRoundingIsUnbiasedBetweenNeighbours) {
  struct Case {
    CodecSpec spec;
    float anchor, v, lo, hi;
  } cases[] = {
      {kE2M1, 6.0f, 1.2f, 1.0f, 1.5f},                 // scale 1: between codes 2 and 3
      {kE2M1, -6.0f, -4.5f, -4.0f, -6.0f},             // gap of 2, negative
      {kE3M0, 1.0f, 0.3f, 0.25f, 0.5f},                // scale 1: between 2^-2 and 2^-1
      {{Codec::kInt8, 64}, 127.0f, 0.3f, 0.0f, 1.0f},  // scale 1
      {{Codec::kBf16, 0}, 1.0f, 1.0f + 0x1p-9f, 1.0f, 1.0f + 0x1p-7f},
  };
  for (const auto& c : cases) {
    std::vector<float> seen;
    const double mean = StochasticMean(c.spec, c.anchor, c.v, &seen);
    // 20000+ draws of a two-point variable: the standard error is below 0.4% of the gap.
    EXPECT_NEAR(mean, c.v, 0.02 * std::fabs(c.hi - c.lo)) << CodecName(c.spec.codec);
    std::sort(seen.begin(), seen.end());
    std::vector<float> both = {std::min(c.lo, c.hi), std::max(c.lo, c.hi)};
    EXPECT_EQ(seen, both) << CodecName(c.spec.codec);
  }
  // A value on a code never moves.
  std::vector<float> seen;
  EXPECT_EQ(StochasticMean(kE2M1, 6.0f, 1.5f, &seen), 1.5);
}

TEST(CodecTest, StochasticRoundingIsReproducibleAndChunkable) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(4096);
  for (auto& v : x) v = normal(rng);
  for (const auto& spec : {kE2M1, kE3M0, CodecSpec{Codec::kInt8, 64}, CodecSpec{Codec::kBf16, 0}}) {
    const size_t bytes = EncodedBytes(spec, x.size());
    std::vector<uint8_t> a(bytes), b(bytes), other_seed(bytes), nearest(bytes);
    ASSERT_TRUE(Encode(spec, x.data(), x.size(), a.data(), {true, 5, 1000}).ok());
    ASSERT_TRUE(Encode(spec, x.data(), x.size(), b.data(), {true, 5, 1000}).ok());
    ASSERT_TRUE(Encode(spec, x.data(), x.size(), other_seed.data(), {true, 6, 1000}).ok());
    ASSERT_TRUE(Encode(spec, x.data(), x.size(), nearest.data()).ok());
    EXPECT_EQ(a, b) << CodecName(spec.codec);
    EXPECT_NE(a, other_seed) << CodecName(spec.codec);
    EXPECT_NE(a, nearest) << CodecName(spec.codec);
    // Two halves encoded on their own, with the index of their first element, give the same bytes.
    const size_t half = x.size() / 2;
    std::vector<uint8_t> lo(EncodedBytes(spec, half)), hi(EncodedBytes(spec, half));
    ASSERT_TRUE(Encode(spec, x.data(), half, lo.data(), {true, 5, 1000}).ok());
    ASSERT_TRUE(Encode(spec, x.data() + half, half, hi.data(), {true, 5, 1000 + half}).ok());
    const auto whole = Dec(spec, a, x.size());
    const auto first = Dec(spec, lo, half), second = Dec(spec, hi, half);
    EXPECT_TRUE(std::equal(first.begin(), first.end(), whole.begin()));
    EXPECT_TRUE(std::equal(second.begin(), second.end(), whole.begin() + half));
  }
  // Scales do not depend on the rounding mode.
  std::vector<uint8_t> s(EncodedBytes(kE2M1, x.size())), n(s.size());
  ASSERT_TRUE(Encode(kE2M1, x.data(), x.size(), s.data(), {true, 5, 0}).ok());
  ASSERT_TRUE(Encode(kE2M1, x.data(), x.size(), n.data()).ok());
  EXPECT_TRUE(std::equal(s.begin(), s.begin() + 128, n.begin()));
}

TEST(CodecTest, Fp4BlocksOf32MatchABruteForceReference) {
  // Blocks of 32 take a compile-time-sized fast path: check it against the plain definition
  // (nearest magnitude by exhaustive search, ties to the even code) on values full of ties.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> quarter(-32, 32), exponent(-20, 20);
  std::vector<float> x(32 * 64 + 7);  // with a partial last block
  for (auto& v : x) v = std::ldexp(float(quarter(rng)) * 0.25f, exponent(rng) / 8);
  for (const auto& spec : {kE2M1, kE3M0}) {
    const float mags_e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    const float mags_e3m0[8] = {0, 0.03125f, 0.0625f, 0.125f, 0.25f, 0.5f, 1, 2};
    const float* mags = spec.codec == Codec::kFp4E2M1 ? mags_e2m1 : mags_e3m0;
    const int offset = spec.codec == Codec::kFp4E2M1 ? 2 : 0;
    const auto y = Dec(spec, Enc(spec, x), x.size());
    for (size_t b = 0; b < x.size(); b += 32) {
      float amax = 0;
      const size_t end = std::min(x.size(), b + 32);
      for (size_t i = b; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      int e = 0;
      if (amax > 0) std::frexp(amax, &e);
      const float scale = amax > 0 ? std::ldexp(1.0f, e - 1 - offset) : std::ldexp(1.0f, -127);
      for (size_t i = b; i < end; ++i) {
        const float v = std::fabs(x[i]) / scale;
        int best = 0;
        for (int c = 1; c < 8; ++c) {
          const float dc = std::fabs(v - mags[c]), db = std::fabs(v - mags[best]);
          if (dc < db || (dc == db && c % 2 == 0)) best = c;
        }
        const float want = (best == 0 ? 0.0f : std::copysign(mags[best] * scale, x[i]));
        ASSERT_EQ(y[i], want) << CodecName(spec.codec) << " element " << i << " = " << x[i];
      }
    }
  }
}

TEST(CodecTest, DeterministicAndSizes) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * float(i % 17);
  for (const auto& spec : {CodecSpec{Codec::kBf16, 0}, CodecSpec{Codec::kInt8, 64}, kE2M1, kE3M0}) {
    EXPECT_EQ(Enc(spec, x), Enc(spec, x));
  }
  EXPECT_EQ(EncodedBytes(kE2M1, 1000), 32u + 500u);   // 8.5x smaller than fp32 at 1000
  EXPECT_EQ(EncodedBytes({Codec::kInt8, 64}, 1000), 16u * 4 + 1000u);
  EXPECT_EQ(EncodedBytes({Codec::kBf16, 0}, 1000), 2000u);
}

// An encoder writes every byte of its output, whatever the buffer held: the service encodes updates
// into the buffers of retired ones (SpareChunkData, outer/base/reused_buffers.h), and every copy
// must get the same bytes. Dense and sparse specs of every codec, Encode and EncodeSparseInput.
TEST(CodecTest, EncodeWritesEveryByteOfItsOutput) {
  const size_t n = 3 * 4096 + 1000;  // a short last chunk, and a partial scale block
  std::vector<float> x(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (auto& v : x) v = normal(rng);
  for (int codec = int(Codec::kFp32); codec <= int(Codec::kInt2Centroid); ++codec) {
    for (uint32_t topk : {0u, 123u}) {
      const uint32_t block = topk > 0 ? 4096u : (codec == int(Codec::kFp32) ||
                                                 codec == int(Codec::kBf16)) ? 0u : 32u;
      auto made = MakeSpec(codec, block, topk);
      ASSERT_TRUE(made.ok()) << codec << " " << topk << ": " << made.status();
      const CodecSpec spec = *made;
      for (const Rounding rounding : {Rounding{}, Rounding{true, 99, 0}}) {
        std::vector<uint8_t> zeros(EncodedBytes(spec, n), 0x00), ones(zeros.size(), 0xFF);
        ASSERT_TRUE(Encode(spec, x.data(), n, zeros.data(), rounding).ok()) << SpecText(spec);
        ASSERT_TRUE(Encode(spec, x.data(), n, ones.data(), rounding).ok()) << SpecText(spec);
        EXPECT_EQ(zeros, ones) << SpecText(spec) << (rounding.stochastic ? " stochastic" : "");
        if (topk == 0) continue;
        std::vector<uint32_t> index;
        std::vector<float> value;
        for (uint32_t i = 0; i < n; i += 37) {
          index.push_back(i);
          value.push_back(x[i]);
        }
        std::fill(zeros.begin(), zeros.end(), 0x00);
        std::fill(ones.begin(), ones.end(), 0xFF);
        for (auto* out : {&zeros, &ones}) {
          ASSERT_TRUE(EncodeSparseInput(spec, n, index.data(), value.data(), index.size(),
                                        out->data(), rounding)
                          .ok());
        }
        EXPECT_EQ(zeros, ones) << SpecText(spec) << " from sparse input";
      }
    }
  }
}

// Every finite input encodes to a payload its own decoder accepts, with the sign kept and the
// magnitude saturated at most: no codec writes bytes that decode to infinity.
TEST(CodecTest, EncodeSaturatesNearTheFloatMaximumAndDecodingAccepts) {
  const float kMax = std::numeric_limits<float>::max();
  std::vector<float> x = {kMax,
                          -kMax,
                          3.3961775e38f,   // rounds to infinity in bf16 without saturation
                          -3.3961775e38f,
                          std::ldexp(1.5f, 127) * 1.0000001f,  // E3M0 past 1.5 x 2^127
                          std::ldexp(1.0f, 127),
                          std::nextafter(kMax, 0.0f),
                          1.0f,
                          -2.5e38f,
                          0.0f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> big(1e38f, kMax);
  for (int i = 0; i < 118; ++i) x.push_back((i % 2 ? -1.0f : 1.0f) * big(rng));
  const CodecSpec specs[] = {{Codec::kFp32, 0}, {Codec::kBf16, 0},      {Codec::kInt8, 64},
                             {Codec::kInt8, 1}, {Codec::kFp4E2M1, 32},  {Codec::kFp4E3M0, 32},
                             {Codec::kFp4E3M0, 2}, {Codec::kFp4E2M1, 2}};
  for (const CodecSpec& spec : specs) {
    for (bool stochastic : {false, true}) {
      Rounding r;
      r.stochastic = stochastic;
      r.seed = 99;
      std::vector<uint8_t> bytes(EncodedBytes(spec, x.size()));
      ASSERT_TRUE(Encode(spec, x.data(), x.size(), bytes.data(), r).ok());
      std::vector<float> y(x.size());
      auto s = Decode(spec, bytes.data(), bytes.size(), x.size(), y.data());
      ASSERT_TRUE(s.ok()) << CodecName(spec.codec) << "/" << spec.block_size
                          << (stochastic ? " stochastic: " : ": ") << s;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << CodecName(spec.codec) << " element " << i;
        if (y[i] != 0) {
          EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "element " << i;
        }
      }
      if (spec.codec == Codec::kBf16) {
        EXPECT_EQ(y[0], 3.3895314e38f);  // bf16's largest finite value
      }
    }
  }
}

TEST(CodecTest, DecodeSliceEqualsTheSameElementsOfAFullDecode) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(1001);
  for (float& v : x) v = normal(rng);
  const CodecSpec specs[] = {{Codec::kFp32, 0},     {Codec::kBf16, 0},     {Codec::kInt8, 64},
                             {Codec::kInt8, 7},     {Codec::kFp4E2M1, 32}, {Codec::kFp4E3M0, 6}};
  std::uniform_int_distribution<size_t> pos(0, x.size());
  for (const CodecSpec& spec : specs) {
    const auto bytes = Enc(spec, x);
    const auto all = Dec(spec, bytes, x.size());
    for (int trial = 0; trial < 50; ++trial) {
      size_t a = pos(rng), b = pos(rng);
      if (a > b) std::swap(a, b);
      std::vector<float> part(b - a);
      ASSERT_TRUE(DecodeSlice(spec, bytes.data(), bytes.size(), x.size(), a, b - a, part.data()).ok());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + long(a)))
          << CodecName(spec.codec) << " [" << a << ", " << b << ")";
    }
    std::vector<float> one(1);
    EXPECT_EQ(DecodeSlice(spec, bytes.data(), bytes.size(), x.size(), x.size(), 1, one.data()).code(),
              absl::StatusCode::kOutOfRange);
  }
}

TEST(CodecTest, RefusesBadInputAndBadSpecs) {
  std::vector<float> x = {1.0f, NAN, 2.0f};
  std::vector<uint8_t> out(EncodedBytes(kE2M1, 3), 0xAB);
  auto s = Encode(kE2M1, x.data(), 3, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("at element 1"));
  // Every codec, inside whole blocks (the vector kernels) and in a partial last block.
  for (const CodecSpec spec : {CodecSpec{Codec::kFp32, 0}, CodecSpec{Codec::kBf16, 0},
                               CodecSpec{Codec::kInt8, 64}, kE2M1, kE3M0}) {
    for (const size_t bad : {size_t(0), size_t(40), size_t(99)}) {
      for (const float v : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> in(100, 0.5f);
        in[bad] = v;
        std::vector<uint8_t> enc(EncodedBytes(spec, in.size()));
        const auto st = Encode(spec, in.data(), in.size(), enc.data());
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << CodecName(spec.codec);
        EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat("at element ", bad)));
      }
    }
  }
  x[1] = INFINITY;
  EXPECT_FALSE(Encode({Codec::kBf16, 0}, x.data(), 3, out.data()).ok());

  std::vector<float> y(3);
  EXPECT_THAT(std::string(Decode(kE2M1, out.data(), out.size() - 1, 3, y.data()).message()),
              HasSubstr("must be"));
  std::vector<uint8_t> nan_scale = {255, 0x11, 0x00};  // E8M0 255 is not a number
  EXPECT_FALSE(Decode({Codec::kFp4E2M1, 4}, nan_scale.data(), 3, 3, y.data()).ok());

  EXPECT_FALSE(MakeSpec(int(Codec::kFp4E2M1), 33).ok());
  EXPECT_FALSE(MakeSpec(int(Codec::kFp32), 32).ok());
  EXPECT_FALSE(MakeSpec(42, 0).ok());
  EXPECT_TRUE(MakeSpec(int(Codec::kInt8), 64).ok());
  EXPECT_EQ(ParseCodec("fp4_e2m1")->block_size, 32u);
  EXPECT_THAT(std::string(ParseCodec("fp5").status().message()), HasSubstr("unknown codec 'fp5'"));
}

}  // namespace
}  // namespace atl::compression
