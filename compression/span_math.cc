#include "compression/span_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "compression/clones.h"

namespace atl::compression {

ATOLL_CLONES void FoldWeighted(const float* x, double weight, double scale, double* sum, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += weight * (double(x[i]) * scale);
}

ATOLL_CLONES void StoreQuotient(const double* sum, double total, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float(sum[i] / total);
}

ATOLL_CLONES double SumSquares(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) lane[k] += double(x[i + k]) * double(x[i + k]);
  }
  for (size_t k = 0; i + k < n; ++k) lane[k] += double(x[i + k]) * double(x[i + k]);
  double total = 0;
  for (size_t k = 0; k < kLanes; ++k) total += lane[k];
  return total;
}

// As bits: non-negative finite floats order like unsigned integers, which vectorizes.
ATOLL_CLONES float MaxAbs(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    m = std::max(m, u & 0x7FFFFFFFu);
  }
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

}  // namespace atl::compression
