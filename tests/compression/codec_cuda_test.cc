// The CUDA kernels against the CPU codecs, byte for byte. Skipped (with the reason) on machines
// without a CUDA device or builds without the kernels.
#include "compression/codec_cuda.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "compression/codec.h"
#include "tests/compression/hard_input.h"

namespace atl::compression {
namespace {

class CodecCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::Available(&why)) GTEST_SKIP() << why;
  }
};

TEST_F(CodecCudaTest, EncodeAndDecodeAreBitIdenticalToCpu) {
  const CodecSpec specs[] = {{Codec::kFp32, 0},     {Codec::kBf16, 0},     {Codec::kInt8, 64},
                             {Codec::kInt8, 7},     {Codec::kFp4E2M1, 32}, {Codec::kFp4E2M1, 2},
                             {Codec::kFp4E2M1, 4096}, {Codec::kFp4E3M0, 32}, {Codec::kFp4E3M0, 100},
                             {Codec::kInt2, 64},    {Codec::kInt2, 4},
                             // Sparse: chunk, kept per chunk (ties, a short last chunk, k = chunk).
                             {Codec::kInt2, 4096, 41}, {Codec::kInt2, 1024, 20},
                             {Codec::kFp4E2M1, 256, 5}, {Codec::kFp4E3M0, 64, 64},
                             {Codec::kInt8, 512, 100}, {Codec::kBf16, 128, 3},
                             {Codec::kFp32, 32, 1}};
  for (const size_t n : {size_t(1), size_t(31), size_t(1000), size_t(1) << 20}) {
    const auto x = HardInput(n, uint32_t(n));
    for (const auto& spec : specs) {
      for (const bool stochastic : {false, true}) {
        const Rounding rounding{stochastic, 1234, 77};
        const size_t bytes = EncodedBytes(spec, n);
        std::vector<uint8_t> cpu(bytes), gpu(bytes, 0xAB);
        ASSERT_TRUE(Encode(spec, x.data(), n, cpu.data(), rounding).ok());
        auto s = cuda::EncodeViaDevice(spec, x.data(), n, gpu.data(), rounding);
        ASSERT_TRUE(s.ok()) << s;
        ASSERT_EQ(cpu, gpu) << SpecText(spec) << " n " << n
                            << (stochastic ? " stochastic" : " nearest");
        std::vector<float> cpu_out(n), gpu_out(n);
        ASSERT_TRUE(Decode(spec, cpu.data(), bytes, n, cpu_out.data()).ok());
        ASSERT_TRUE(cuda::DecodeViaDevice(spec, cpu.data(), bytes, n, gpu_out.data()).ok());
        ASSERT_EQ(0, std::memcmp(cpu_out.data(), gpu_out.data(), n * 4))
            << SpecText(spec) << " n " << n;
      }
    }
  }
}

TEST_F(CodecCudaTest, RefusesNonFiniteInputAndPayloads) {
  std::vector<float> x(1000, 1.0f);
  x[517] = NAN;
  std::vector<uint8_t> out(EncodedBytes({Codec::kFp4E2M1, 32}, x.size()), 0xAB);
  auto s = cuda::EncodeViaDevice({Codec::kFp4E2M1, 32}, x.data(), x.size(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("element 517"));
  std::vector<uint8_t> nan_scale = {255, 0x11, 0x00};  // E8M0 255 is not a number
  std::vector<float> y(3);
  EXPECT_FALSE(cuda::DecodeViaDevice({Codec::kFp4E2M1, 4}, nan_scale.data(), 3, 3, y.data()).ok());
}

// A sparse payload with a broken index list: refused before anything is applied, in the CPU
// decoder's words (which name the chunk and the problem).
TEST_F(CodecCudaTest, RefusesBrokenSparseIndexListsLikeTheCpu) {
  const CodecSpec spec{Codec::kInt2, 1024, 20};
  const size_t n = 5000;
  const auto x = HardInput(n, 3);
  std::vector<uint8_t> payload(EncodedBytes(spec, n));
  ASSERT_TRUE(Encode(spec, x.data(), n, payload.data(), {}).ok());
  const size_t chunk_bytes = payload.size() / 5 + 1;  // 4 full chunks and a short one
  for (const size_t at : {chunk_bytes * 2 - 1, payload.size() - 1, chunk_bytes - 3}) {
    auto broken = payload;
    broken[at] ^= 0x5A;
    std::vector<float> cpu(n), gpu(n);
    const absl::Status want = Decode(spec, broken.data(), broken.size(), n, cpu.data());
    const absl::Status got = cuda::DecodeViaDevice(spec, broken.data(), broken.size(), n, gpu.data());
    EXPECT_EQ(got, want) << "byte " << at;
  }
}

TEST(CodecCudaBuildTest, UnavailableSaysWhy) {
  std::string why;
  if (cuda::Available(&why)) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(why.empty());
  std::vector<float> x(4, 1.0f);
  std::vector<uint8_t> out(16);
  EXPECT_FALSE(cuda::EncodeViaDevice({Codec::kFp32, 0}, x.data(), 4, out.data()).ok());
}

}  // namespace
}  // namespace atl::compression
