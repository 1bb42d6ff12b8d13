// Encode and decode throughput of every codec against memcpy of the same fp32 bytes, one core,
// measured side by side in one run (median of repetitions); then the parameters' hash
// (compression::ParamsHash, the version the CPU picked: compression/clones.h) in ns per element.
//
//   build/tests/bench/codec_bench [MiB of fp32 input = 64] [repetitions = 7]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "compression/checksum.h"
#include "compression/codec.h"

namespace {

using Clock = std::chrono::steady_clock;

double MedianSeconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? size_t(std::atoi(argv[1])) : 64;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  const size_t n = mib * (1 << 20) / 4;
  std::vector<float> x(n), y(n), copy(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (auto& v : x) v = normal(rng);
  const double bytes = double(n) * 4;

  const double memcpy_s = MedianSeconds(reps, [&] { std::memcpy(copy.data(), x.data(), n * 4); });
  const double memcpy_gbs = bytes / memcpy_s / 1e9;
  std::printf("%zu MiB of fp32, %d repetitions, one thread\n", mib, reps);
  std::printf("%-15s %10s %8s %10s %8s %8s\n", "codec", "encode", "vs cpy", "decode", "vs cpy",
              "ratio");
  std::printf("%-15s %7.2f GB/s %7.0f%% %7.2f GB/s %7.0f%% %8s\n", "memcpy", memcpy_gbs, 100.0,
              memcpy_gbs, 100.0, "1x");
  // "+sr": stochastic rounding; "top1%:": sparse, 1% of each chunk of 4096 kept (SparseLoCo's).
  for (const std::string name : {"fp32", "bf16", "int8", "fp4_e2m1", "fp4_e3m0", "int2", "bf16+sr",
                                 "int8+sr", "fp4_e2m1+sr", "fp4_e3m0+sr", "int2+sr", "top1%:int2",
                                 "top1%:int2+sr", "top3%:int2", "top1%:fp4_e2m1", "top1%:fp32"}) {
    std::string row = name;
    uint32_t topk = 0;
    if (row.rfind("top", 0) == 0) {
      topk = uint32_t(std::lround(4096 * std::atof(row.c_str() + 3) / 100));
      row = row.substr(row.find(':') + 1);
    }
    const bool stochastic = row.size() > 3 && row.compare(row.size() - 3, 3, "+sr") == 0;
    auto spec = *atl::compression::ParseCodec(stochastic ? row.substr(0, row.size() - 3) : row);
    if (topk > 0) spec = *atl::compression::MakeSpec(int(spec.codec), 4096, topk);
    const atl::compression::Rounding rounding{stochastic, 7, 0};
    std::vector<uint8_t> enc(atl::compression::EncodedBytes(spec, n));
    const double e = MedianSeconds(reps, [&] {
      if (!atl::compression::Encode(spec, x.data(), n, enc.data(), rounding).ok()) std::abort();
    });
    const double d = MedianSeconds(reps, [&] {
      if (!atl::compression::Decode(spec, enc.data(), enc.size(), n, y.data()).ok()) std::abort();
    });
    std::printf("%-15s %7.2f GB/s %7.0f%% %7.2f GB/s %7.0f%% %7.2fx\n", name.c_str(), bytes / e / 1e9,
                100.0 * memcpy_s / e, bytes / d / 1e9, 100.0 * memcpy_s / d, bytes / double(enc.size()));
  }
  uint64_t sum = 0;
  const double hash_s = MedianSeconds(reps, [&] { sum += atl::compression::ParamsHashSum(x.data(), 0, n); });
  std::printf("parameters' hash: %.3f ns per element (%.0f%% of memcpy's time; sum %016llx)\n",
              1e9 * hash_s / double(n), 100.0 * hash_s / memcpy_s, (unsigned long long)sum);
  return 0;
}
