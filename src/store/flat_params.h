// Bridges the model's named parameters and the outer loop's flat fp32 vectors.
#ifndef ATOLL_SRC_STORE_FLAT_PARAMS_H_
#define ATOLL_SRC_STORE_FLAT_PARAMS_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "inner/model.h"
#include "outer/service/sync_server.h"

namespace atl {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

outer::FragmentLayout LayoutOf(const NamedParams& params);
// Concatenation of the parameters (fp32, model order, each in the canonical flat order of the
// model's plan).
std::vector<float> Flatten(const inner::ParallelPlan& plan, const NamedParams& params);
// Copies `flat` into the parameters (sizes must match the layout).
void LoadFlat(const inner::ParallelPlan& plan, const std::vector<float>& flat,
              const NamedParams& params);
// The same over a subset of the parameters (indices into `params`, in that order), and the
// Streaming DiLoCo merge: theta = alpha * theta + (1 - alpha) * flat (alpha = 0 loads `flat`).
std::vector<float> Flatten(const inner::ParallelPlan& plan, const NamedParams& params,
                           const std::vector<size_t>& subset);
void LoadFlat(const inner::ParallelPlan& plan, const std::vector<float>& flat,
              const NamedParams& params, const std::vector<size_t>& subset, double alpha = 0.0);

// XXH64 of the resolved [model] config: islands and service must build the same model.
uint64_t ModelConfigHash(const inner::ModelConfig& model);
// The same for a model atoll does not build (a Python module): XXH64 of its parameters' names and
// shapes, in order.
uint64_t LayoutHash(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes);

}  // namespace atl

#endif  // ATOLL_SRC_STORE_FLAT_PARAMS_H_
