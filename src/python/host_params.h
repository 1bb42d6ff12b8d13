// A user's parameters as the Python island reads and writes them, without libtorch: each is host
// memory (the tensor's own on the CPU; a mirror the Python side keeps for a GPU tensor),
// contiguous and row-major, of a floating-point dtype. The outer step sees them flat, in fp32, in
// the run's order (atoll's canonical order for atoll's own model: row-parallel weights
// input-major; row-major for any other module).
#ifndef ATOLL_SRC_PYTHON_HOST_PARAMS_H_
#define ATOLL_SRC_PYTHON_HOST_PARAMS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "inner/model/plan.h"

namespace atl::python {

enum class DType { kFloat32, kFloat64, kBFloat16, kFloat16 };

// "float32", "float64", "bfloat16", "float16" (torch's names without "torch."); others refused
// by name.
absl::StatusOr<DType> DTypeNamed(const std::string& name);

struct HostParam {
  std::string name;
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t numel() const;
};

// Names what is wrong with them: no parameters, a null pointer, a negative dimension, one name
// twice, or two parameters over the same memory (tied weights: one tensor under two names).
absl::Status CheckHostParams(const std::vector<HostParam>& params);

// Parameters `subset` (indices into `params`, in that order), each in the plan's canonical order,
// as fp32 one after the other.
std::vector<float> FlattenHost(const inner::ParallelPlan& plan, const std::vector<HostParam>& params,
                               const std::vector<size_t>& subset);
// The Streaming DiLoCo merge into them: theta = alpha * theta + (1 - alpha) * flat (alpha 0:
// `flat` loaded), each value rounded to its parameter's dtype (to nearest, ties to even).
void LoadHost(const inner::ParallelPlan& plan, const std::vector<float>& flat,
              const std::vector<HostParam>& params, const std::vector<size_t>& subset,
              double alpha);

}  // namespace atl::python

#endif  // ATOLL_SRC_PYTHON_HOST_PARAMS_H_
