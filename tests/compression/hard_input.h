// Inputs for codec tests: ordinary values, and those for comparing two implementations of a codec
// byte for byte.
#ifndef ATOLL_TESTS_COMPRESSION_HARD_INPUT_H_
#define ATOLL_TESTS_COMPRESSION_HARD_INPUT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace atl::compression {

// Pseudo-gradient-like values: N(0, 0.01), from `seed`.
inline std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Values that exercise every rule: ties, subnormals, zero blocks, saturation, huge and tiny scales.
inline std::vector<float> HardInput(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-140, 120), kind(0, 10);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    switch (kind(rng)) {
      case 0: x[i] = kind(rng) % 2 ? 0.0f : -0.0f; break;
      case 1: x[i] = std::ldexp(float(int(normal(rng) * 8)) * 0.25f, 0); break;  // ties
      case 2: x[i] = std::ldexp(normal(rng), -135); break;                        // subnormal
      case 3: x[i] = std::ldexp(normal(rng), exponent(rng)); break;
      case 4:  // near FLT_MAX: the saturation rules (int8 scale, bf16, E3M0 at 2^127)
        x[i] = (normal(rng) < 0 ? -1.0f : 1.0f) *
               std::ldexp(std::min(1.9999f, 1.0f + std::abs(normal(rng)) / 8), 127);
        break;
      default: x[i] = normal(rng) * 1e-3f; break;
    }
  }
  for (size_t i = 64; i < std::min<size_t>(n, 128); ++i) x[i] = 0.0f;  // whole zero blocks
  return x;
}

}  // namespace atl::compression

#endif  // ATOLL_TESTS_COMPRESSION_HARD_INPUT_H_
