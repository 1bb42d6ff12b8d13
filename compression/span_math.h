// Arithmetic over fp32 spans that the service runs on every value of every contribution: folding
// a decoded window into sums, and a window's statistics. Vectorized (AVX-512 or AVX2 where the CPU
// has it, chosen at run time: clones.h), with results that never depend on the instruction set:
// the folds are elementwise, and sums run in eight fixed lanes (element i in lane i % 8) added in
// lane order.
#ifndef ATOLL_COMPRESSION_SPAN_MATH_H_
#define ATOLL_COMPRESSION_SPAN_MATH_H_

#include <cstddef>

namespace atl::compression {

// sum[i] += weight * (double(x[i]) * scale), i < n.
void FoldWeighted(const float* x, double weight, double scale, double* sum, size_t n);
// out[i] = float(sum[i] / total), i < n.
void StoreQuotient(const double* sum, double total, float* out, size_t n);
// Sum of x[i]^2 in double.
double SumSquares(const float* x, size_t n);
// Largest |x[i]| (0 for n = 0; the values must be finite).
float MaxAbs(const float* x, size_t n);

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_SPAN_MATH_H_
