// What every codec of the traits table must do, checked for each row: a new codec is tested by
// these as soon as its row is in the table (compression/codec_traits.h).
#include "compression/codec_traits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/codec_cuda.h"
#include "tests/compression/hard_input.h"

namespace atl::compression {
namespace {

using ::testing::HasSubstr;

std::vector<const CodecTraits*> AllRows() {
  size_t n = 0;
  const CodecTraits* const* rows = Codecs(&n);
  return std::vector<const CodecTraits*>(rows, rows + n);
}

TEST(CodecTraitsTest, EveryRowIsFoundByNameAndNumberAndHasAValidDefault) {
  const auto rows = AllRows();
  ASSERT_GE(rows.size(), 6u);
  for (const CodecTraits* t : rows) {
    SCOPED_TRACE(t->name);
    EXPECT_EQ(FindCodec(t->id), t);
    EXPECT_EQ(FindCodec(std::string(t->name)), t);
    auto spec = ParseCodec(t->name);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->codec, t->id);
    EXPECT_EQ(spec->block_size, t->default_block);
    EXPECT_TRUE(MakeSpec(int(t->id), t->default_block).ok());
    EXPECT_EQ(CodecName(t->id), t->name);
    EXPECT_THAT(CodecsHelp(), HasSubstr(t->name));
    if (t->default_block > 0) {
      EXPECT_FALSE(MakeSpec(int(t->id), t->max_block + 1).ok());
      EXPECT_FALSE(MakeSpec(int(t->id), 0).ok());
    } else {
      EXPECT_FALSE(MakeSpec(int(t->id), 32).ok());
    }
  }
  EXPECT_EQ(FindCodec("fp5"), nullptr);
  EXPECT_EQ(FindCodec(Codec(99)), nullptr);
}

// EncodedBytes follows the layout rule, and encoding writes exactly that many bytes (a canary
// after them stays).
TEST(CodecTraitsTest, PayloadsHaveTheLayoutsSize) {
  for (const CodecTraits* t : AllRows()) {
    SCOPED_TRACE(t->name);
    const CodecSpec spec = *ParseCodec(t->name);
    for (const size_t n : {size_t(1), size_t(31), size_t(32), size_t(1000)}) {
      const size_t blocks = spec.block_size ? (n + spec.block_size - 1) / spec.block_size : 0;
      const size_t bytes = blocks * t->block_bytes + (n * t->element_bits + 7) / 8;
      ASSERT_EQ(EncodedBytes(spec, n), bytes);
      const auto x = Normal(n, uint32_t(n));
      std::vector<uint8_t> out(bytes + 8, 0xA5);
      ASSERT_TRUE(Encode(spec, x.data(), n, out.data()).ok());
      for (size_t i = bytes; i < out.size(); ++i) ASSERT_EQ(out[i], 0xA5) << "byte " << i;
      std::vector<float> y(n);
      ASSERT_TRUE(Decode(spec, out.data(), bytes, n, y.data()).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(y[i]));
        if (y[i] != 0) {
          EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "element " << i;
        }
      }
    }
  }
}

// A chunk cut on the block grid (SliceOf, as payloads are sliced for a rank's range) is a payload
// of its own: it decodes to the same elements as the whole payload.
TEST(CodecTraitsTest, SlicesOnTheBlockGridArePayloadsOfTheirOwn) {
  std::mt19937 rng(5);
  for (const CodecTraits* t : AllRows()) {
    SCOPED_TRACE(t->name);
    for (const uint32_t block : {t->default_block, t->min_block}) {
      const CodecSpec spec = *MakeSpec(int(t->id), block);
      const size_t n = 1001, grid = block > 0 ? block : 1;
      const auto x = Normal(n, 11);
      std::vector<uint8_t> bytes(EncodedBytes(spec, n));
      ASSERT_TRUE(Encode(spec, x.data(), n, bytes.data()).ok());
      std::vector<float> all(n);
      ASSERT_TRUE(Decode(spec, bytes.data(), bytes.size(), n, all.data()).ok());
      std::uniform_int_distribution<size_t> cut(0, (n + grid - 1) / grid);
      for (int trial = 0; trial < 30; ++trial) {
        size_t a = std::min(n, cut(rng) * grid), b = std::min(n, cut(rng) * grid);
        if (a > b) std::swap(a, b);
        if (a == b) continue;
        const SliceLayout s = SliceOf(spec, n, a, b);
        std::vector<uint8_t> part(bytes.begin() + long(s.blocks_offset),
                                  bytes.begin() + long(s.blocks_offset + s.blocks_bytes));
        part.insert(part.end(), bytes.begin() + long(s.elements_offset),
                    bytes.begin() + long(s.elements_offset + s.elements_bytes));
        ASSERT_EQ(part.size(), EncodedBytes(spec, b - a));
        std::vector<float> y(b - a);
        ASSERT_TRUE(Decode(spec, part.data(), part.size(), b - a, y.data()).ok());
        for (size_t i = a; i < b; ++i) ASSERT_EQ(y[i - a], all[i]) << "[" << a << ", " << b << ")";
      }
    }
  }
}

TEST(CodecTraitsTest, EveryCodecRefusesNonFiniteInputNamingTheElement) {
  for (const CodecTraits* t : AllRows()) {
    SCOPED_TRACE(t->name);
    const CodecSpec spec = *ParseCodec(t->name);
    for (const size_t bad : {size_t(0), size_t(40), size_t(99)}) {
      for (const float v : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> in(100, 0.5f);
        in[bad] = v;
        std::vector<uint8_t> out(EncodedBytes(spec, in.size()));
        const auto s = Encode(spec, in.data(), in.size(), out.data());
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("at element ", bad)));
      }
    }
  }
}

// A codec that says it rounds stochastically does: the same input gives other codes for other
// seeds, and the same codes for the same seed.
TEST(CodecTraitsTest, StochasticRoundingIsWhatTheRowSays) {
  const auto x = Normal(4096, 3);
  for (const CodecTraits* t : AllRows()) {
    SCOPED_TRACE(t->name);
    const CodecSpec spec = *ParseCodec(t->name);
    auto encode = [&](bool stochastic, uint64_t seed) {
      std::vector<uint8_t> out(EncodedBytes(spec, x.size()));
      EXPECT_TRUE(Encode(spec, x.data(), x.size(), out.data(), {stochastic, seed, 0}).ok());
      return out;
    };
    EXPECT_EQ(encode(true, 1), encode(true, 1));
    EXPECT_EQ(encode(true, 1) != encode(true, 2), t->stochastic_rounding);
  }
}

// The CUDA kernels of a build with them are those the rows promise.
TEST(CodecTraitsTest, CudaKernelsAreThoseTheRowsPromise) {
  if (!cuda::Supports(Codec::kFp32)) GTEST_SKIP() << "a build without the CUDA kernels";
  for (const CodecTraits* t : AllRows()) EXPECT_EQ(cuda::Supports(t->id), t->cuda) << t->name;
}

}  // namespace
}  // namespace atl::compression
