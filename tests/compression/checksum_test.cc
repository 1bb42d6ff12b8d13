#include "compression/checksum.h"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace atl::compression
