// fp8_e4m3 (compression/codec_fp8.cc) against values computed here from the format's definition.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "compression/codec.h"

namespace atl::compression {
namespace {

const CodecSpec kFp8{Codec::kFp8E4M3, 32};

// E4M3's magnitude of code c (0..126), from the format: subnormals c x 2^-9, then
// (1 + m / 8) x 2^(e - 7).
double Magnitude(int c) {
  if (c < 8) return c * std::ldexp(1.0, -9);
  return (1.0 + (c & 7) / 8.0) * std::ldexp(1.0, (c >> 3) - 7);
}

// The nearest code by brute force over every magnitude, ties to the even code, saturating.
int NearestCode(double v) {
  int best = 0;
  for (int c = 1; c <= 126; ++c) {
    const double d = std::fabs(Magnitude(c) - v), db = std::fabs(Magnitude(best) - v);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return best;
}

std::vector<uint8_t> Enc(const std::vector<float>& x, Rounding r = {}) {
  std::vector<uint8_t> out(EncodedBytes(kFp8, x.size()));
  EXPECT_TRUE(Encode(kFp8, x.data(), x.size(), out.data(), r).ok());
  return out;
}

TEST(Fp8Test, EveryCodeDecodesToItsMagnitude) {
  // One block at scale 2^0 (byte 127) holding codes 0..126 with both signs.
  std::vector<uint8_t> payload = {127};
  std::vector<float> want;
  for (int c = 0; c <= 126; ++c) {
    payload.push_back(uint8_t(c));
    want.push_back(float(Magnitude(c)));
    payload.push_back(uint8_t(c | 0x80));
    want.push_back(-float(Magnitude(c)));
  }
  const CodecSpec one_block{Codec::kFp8E4M3, uint32_t(want.size())};
  std::vector<float> y(want.size());
  ASSERT_TRUE(Decode(one_block, payload.data(), payload.size(), y.size(), y.data()).ok());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], want[i]) << "code " << int(payload[i + 1]);
  EXPECT_EQ(Magnitude(126), 448.0);
}

TEST(Fp8Test, GoldenBytes) {
  // amax 448: scale 2^(8 - 8) = 1 (byte 127); 1 is exponent 7 (0x38), -0.5 is 0xB0, a value
  // that rounds to zero is +0, 2^-9 the smallest subnormal.
  const std::vector<float> x = {448.0f, 1.0f, -0.5f, -1e-6f, std::ldexp(1.0f, -9), 3.25f};
  const auto b = Enc(x);
  ASSERT_EQ(b.size(), 1u + x.size());
  EXPECT_EQ(b[0], 127);
  EXPECT_EQ(b[1], 0x7E);
  EXPECT_EQ(b[2], 0x38);
  EXPECT_EQ(b[3], 0xB0);
  EXPECT_EQ(b[4], 0x00);
  EXPECT_EQ(b[5], 0x01);
  EXPECT_EQ(b[6], 0x45);  // 3.25 = 1.625 x 2^1: exponent 8, mantissa 5
  // A block whose largest magnitude is 1e-3 takes scale 2^(floor(log2 1e-3) - 8) = 2^-18.
  EXPECT_EQ(Enc({1e-3f, 0.0f})[0], uint8_t(127 - 18));
}

// Nearest rounding equals the brute-force nearest code for random values, the magnitudes
// themselves and every midpoint between neighbours (ties to even), at a fixed scale.
TEST(Fp8Test, NearestRoundingMatchesABruteForceReference) {
  std::vector<float> v;
  for (int c = 0; c < 126; ++c) {
    v.push_back(float(Magnitude(c)));
    v.push_back(float((Magnitude(c) + Magnitude(c + 1)) / 2));  // exact in float
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> any(0.0f, 500.0f);
  for (int i = 0; i < 4000; ++i) v.push_back(any(rng) * std::ldexp(1.0f, -int(rng() % 12)));
  for (const float value : v) {
    // Block [anchor, value]: the anchor 300 fixes the scale at 2^0.
    const auto b = Enc({300.0f, value});
    ASSERT_EQ(b[0], 127);
    ASSERT_EQ(int(b[2]), NearestCode(value)) << "value " << value;
    const auto neg = Enc({300.0f, -value});
    ASSERT_EQ(int(neg[2]), value == 0 || NearestCode(value) == 0 ? 0 : NearestCode(value) | 0x80);
  }
  // Past 448 saturates.
  EXPECT_EQ(Enc({511.0f, 480.0f})[2], 0x7E);
}

TEST(Fp8Test, StochasticRoundingIsUnbiasedBetweenNeighbours) {
  // 1.1 lies between 1 (0x38) and 1.125 (0x39).
  std::vector<float> x(200000, 1.1f);
  for (size_t i = 0; i < x.size(); i += 32) x[i] = 300.0f;  // each block at scale 1
  const auto b = Enc(x, {true, 7, 0});
  std::vector<float> y(x.size());
  ASSERT_TRUE(Decode(kFp8, b.data(), b.size(), y.size(), y.data()).ok());
  double sum = 0;
  size_t n = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (i % 32 == 0) continue;
    ASSERT_TRUE(y[i] == 1.0f || y[i] == 1.125f) << y[i];
    sum += y[i];
    ++n;
  }
  EXPECT_NEAR(sum / double(n), 1.1, 1e-3);
}

TEST(Fp8Test, RefusesTheNaNCodeAndAnInfiniteScale) {
  std::vector<float> y(2);
  const std::vector<uint8_t> nan_code = {127, 0x7F, 0x00};
  EXPECT_EQ(Decode({Codec::kFp8E4M3, 2}, nan_code.data(), 3, 2, y.data()).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint8_t> inf_scale = {255, 0x01, 0x00};
  EXPECT_FALSE(Decode({Codec::kFp8E4M3, 2}, inf_scale.data(), 3, 2, y.data()).ok());
  // Near the float maximum every code stays finite.
  const float kMax = std::numeric_limits<float>::max();
  const auto b = Enc({kMax, -kMax, 1.0f});
  std::vector<float> z(3);
  ASSERT_TRUE(Decode(kFp8, b.data(), b.size(), 3, z.data()).ok());
  EXPECT_LT(z[1], 0.0f);
}

}  // namespace
}  // namespace atl::compression
