// int2_centroid (compression/codec_int2.cc): 2-bit codes decoding through a table of each block's
// bin means, checked against a reference computed here, dense and as the sparse value codec; its
// malformed tables refused; and its error on top-k values against int2's at equal bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "compression/codec.h"
#include "compression/codec_traits.h"
#include "tests/compression/hard_input.h"

namespace atl::compression {
namespace {

using ::testing::HasSubstr;

const CodecSpec kDense{Codec::kInt2Centroid, 64};

// The rule as the row states it, written out plainly: t = mean |x| (double, element order), bins
// cut at -t, 0 and t, each element decoded to its bin's mean (double sum / count).
std::vector<float> Reference(const std::vector<float>& x, size_t block) {
  std::vector<float> y(x.size());
  for (size_t first = 0; first < x.size(); first += block) {
    const size_t last = std::min(x.size(), first + block);
    double magnitude = 0;
    for (size_t i = first; i < last; ++i) magnitude += std::fabs(double(x[i]));
    const float t = float(magnitude / double(last - first));
    auto bin = [t](float v) { return v < -t ? 0 : v < 0.0f ? 1 : v < t ? 2 : 3; };
    double sum[4] = {};
    int count[4] = {};
    for (size_t i = first; i < last; ++i) {
      sum[bin(x[i])] += double(x[i]);
      ++count[bin(x[i])];
    }
    for (size_t i = first; i < last; ++i) {
      y[i] = float(sum[bin(x[i])] / double(count[bin(x[i])]));
    }
  }
  return y;
}

std::vector<float> RoundTrip(const CodecSpec& spec, const std::vector<float>& x) {
  std::vector<uint8_t> bytes(EncodedBytes(spec, x.size()));
  EXPECT_TRUE(Encode(spec, x.data(), x.size(), bytes.data()).ok());
  std::vector<float> y(x.size());
  EXPECT_TRUE(Decode(spec, bytes.data(), bytes.size(), x.size(), y.data()).ok());
  return y;
}

TEST(Int2CentroidTest, DecodesEachValueToItsBinsMeanAsTheReferenceDoes) {
  for (const uint32_t seed : {1u, 2u, 3u}) {
    for (const size_t n : {size_t(4), size_t(64), size_t(1000)}) {
      const auto x = seed == 3 ? HardInput(n, seed) : Normal(n, seed);
      const auto y = RoundTrip(kDense, x);
      const auto want = Reference(x, kDense.block_size);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], want[i]) << "element " << i << " of " << n;
    }
  }
}

// A bin's decoded values sum to its values' sum (to float rounding): so does the block.
TEST(Int2CentroidTest, KeepsEachBlocksSum) {
  const auto x = Normal(4096, 9);
  const auto y = RoundTrip(kDense, x);
  for (size_t first = 0; first < x.size(); first += kDense.block_size) {
    double in = 0, out = 0, scale = 0;
    for (size_t i = first; i < first + kDense.block_size; ++i) {
      in += x[i];
      out += y[i];
      scale += std::fabs(x[i]);
    }
    EXPECT_NEAR(out, in, 1e-6 * scale) << "block at " << first;
  }
}

// The sparse codec's kept values are one block: the same table rule over the k values kept.
TEST(Int2CentroidTest, SparseChunksDecodeTheirKeptValuesThroughOneTable) {
  const CodecSpec sparse{Codec::kInt2Centroid, 1024, 31};
  const auto x = Normal(5000, 4);
  std::vector<uint8_t> bytes(EncodedBytes(sparse, x.size()));
  ASSERT_TRUE(Encode(sparse, x.data(), x.size(), bytes.data()).ok());
  std::vector<uint32_t> index;
  std::vector<float> value;
  ASSERT_TRUE(DecodeKept(sparse, bytes.data(), bytes.size(), x.size(), 0, x.size(), &index, &value)
                  .ok());
  ASSERT_EQ(index.size(), 31u * 4 + 31u);  // four full chunks and a short one, 31 each
  for (size_t c = 0; c * 31 < index.size(); ++c) {
    std::vector<float> kept;
    for (size_t j = c * 31; j < (c + 1) * 31; ++j) kept.push_back(x[index[j]]);
    const auto want = Reference(kept, kept.size());
    for (size_t j = 0; j < kept.size(); ++j) {
      ASSERT_EQ(value[c * 31 + j], want[j]) << "chunk " << c << ", kept value " << j;
    }
  }
}

// Top-k values (the largest magnitudes of each chunk) through int2 and int2_centroid at about
// equal bytes per parameter: the table's 12 more bytes per chunk are paid for by keeping fewer
// values (int2 keeps as many more as fit), and the squared error over every element, those
// dropped included, is smaller with the centroids.
TEST(Int2CentroidTest, CarriesTopKValuesWithLessErrorThanInt2AtEqualBytes) {
  const size_t n = 64 * 4096;
  const auto x = Normal(n, 12);
  const CodecSpec centroid{Codec::kInt2Centroid, 4096, 123};
  CodecSpec int2{Codec::kInt2, 4096, 123};  // as many values as fit in the centroids' bytes
  while (EncodedBytes({Codec::kInt2, 4096, int2.topk + 1}, n) <= EncodedBytes(centroid, n)) {
    ++int2.topk;
  }
  ASSERT_GT(int2.topk, centroid.topk);
  auto error = [&](const CodecSpec& spec) {
    const auto y = RoundTrip(spec, x);
    double e = 0;
    for (size_t i = 0; i < n; ++i) e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    return e;
  };
  const double with_centroids = error(centroid), with_int2 = error(int2);
  EXPECT_LT(with_centroids, with_int2);
  std::printf("squared error over %zu values: int2_centroid top-%u %.6g, int2 top-%u %.6g (%zu "
              "and %zu bytes)\n", n, centroid.topk, with_centroids, int2.topk, with_int2,
              EncodedBytes(centroid, n), EncodedBytes(int2, n));
}

// Tables that no encoder writes are refused with the block named, dense and sparse: a NaN or
// infinite level too when no code of the block uses it (the block's codes all pick level 1), so
// no decoded value shows it.
TEST(Int2CentroidTest, RefusesMalformedTablesNamingTheBlock) {
  const size_t n = 256;
  const auto x = Normal(n, 5);
  std::vector<uint8_t> good(EncodedBytes(kDense, n));
  ASSERT_TRUE(Encode(kDense, x.data(), n, good.data()).ok());
  const float tables[][4] = {{NAN, -1, 1, 2},   {-2, -1, 1, INFINITY}, {-1, -2, 1, 2},
                             {-2, 0.5f, 1, 2}, {-2, -1, -0.5f, 2},   {-2, -1, 2, 1}};
  const size_t codes = 16 * (n / 64);  // where the codes start, after the 4 tables
  for (const auto& table : tables) {
    std::vector<uint8_t> bad = good;
    std::memcpy(bad.data() + 16 * 2, table, 16);  // block 2
    std::fill(bad.begin() + long(codes + 2 * 16), bad.begin() + long(codes + 3 * 16), 0x55);
    std::vector<float> y(n, 7.0f);
    const auto s = Decode(kDense, bad.data(), bad.size(), n, y.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("int2_centroid block 2 (elements from 128)"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("ascending"));
    // A slice without block 2 decodes.
    EXPECT_TRUE(DecodeSlice(kDense, bad.data(), bad.size(), n, 0, 128, y.data()).ok());
  }
  const CodecSpec sparse{Codec::kInt2Centroid, 64, 8};
  std::vector<uint8_t> bytes(EncodedBytes(sparse, n));
  ASSERT_TRUE(Encode(sparse, x.data(), n, bytes.data()).ok());
  const size_t chunk_bytes = EncodedBytes(sparse, 64);
  const float flipped[4] = {1, -1, 1, 2};
  std::memcpy(bytes.data() + 3 * chunk_bytes, flipped, 16);  // chunk 3's table
  std::vector<float> y(n);
  const auto s = Decode(sparse, bytes.data(), bytes.size(), n, y.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("sparse chunk 3's values: int2_centroid"));
  std::vector<uint32_t> index;
  std::vector<float> value;
  EXPECT_EQ(DecodeKept(sparse, bytes.data(), bytes.size(), n, 0, n, &index, &value).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace atl::compression
