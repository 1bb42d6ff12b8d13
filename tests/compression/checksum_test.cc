#include "compression/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace atl::compression {
namespace {

TEST(ChecksumTest, MatchesPublishedXxh64Vectors) {
  EXPECT_EQ(Checksum("", 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(Checksum("a", 1), 0xD24EC4F1A98C6E5BULL);
}

TEST(ChecksumTest, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 10000; ++i) data.push_back(char(i * 131 % 251));
  Hasher h;
  h.Update(data.data(), 7);
  h.Update(data.data() + 7, 4000);
  h.Update(data.data() + 4007, data.size() - 4007);
  EXPECT_EQ(h.Digest(), Checksum(data.data(), data.size()));
}

TEST(ChecksumTest, DetectsASingleFlippedBit) {
  std::string data(4096, 'x');
  const uint64_t before = Checksum(data.data(), data.size());
  data[1234] ^= 0x10;
  EXPECT_NE(Checksum(data.data(), data.size()), before);
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(i % 97) * 0.01f - 0.3f;
  return x;
}

TEST(ParamsHashTest, SplitsAndUpdatesAgreeWithTheWhole) {
  std::vector<float> x = Ramp(10007);
  const uint64_t whole = ParamsHashSum(x.data(), 0, x.size());
  // Any split sums to the whole (ranges of ranks, threads).
  EXPECT_EQ(ParamsHashSum(x.data(), 0, 3001) + ParamsHashSum(x.data() + 3001, 3001, 7006), whole);
  // A change to one element, applied as terms out and in, equals hashing again.
  uint64_t sum = whole;
  sum -= ParamsHashTerm(5000, x[5000]);
  x[5000] = 1.5f;
  sum += ParamsHashTerm(5000, x[5000]);
  EXPECT_EQ(sum, ParamsHashSum(x.data(), 0, x.size()));
  EXPECT_NE(ParamsHashOf(sum, x.size()), ParamsHashOf(whole, x.size()));
}

TEST(ParamsHashTest, SeesPositionsBitsAndLength) {
  std::vector<float> x = Ramp(4096);
  const uint64_t before = ParamsHash(x.data(), 0, x.size());
  std::swap(x[10], x[20]);  // the same values elsewhere
  EXPECT_NE(ParamsHash(x.data(), 0, x.size()), before);
  std::swap(x[10], x[20]);
  uint32_t bits;
  std::memcpy(&bits, &x[4000], 4);
  bits ^= 1u;  // the lowest mantissa bit
  std::memcpy(&x[4000], &bits, 4);
  EXPECT_NE(ParamsHash(x.data(), 0, x.size()), before);
  // Zeros appended, and the same values at other indices, hash differently.
  const std::vector<float> zeros(8, 0.0f);
  EXPECT_NE(ParamsHash(zeros.data(), 0, 4), ParamsHash(zeros.data(), 0, 8));
  EXPECT_NE(ParamsHash(zeros.data(), 0, 4), ParamsHash(zeros.data(), 4, 4));
  EXPECT_NE(ParamsHash(zeros.data(), 0, 0), ParamsHash(zeros.data(), 0, 1));
}

}  // namespace
}  // namespace atl::compression
