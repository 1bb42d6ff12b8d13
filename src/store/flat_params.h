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
#include "src/store/model_hashes.h"  // ModelConfigHash, LayoutHash

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

}  // namespace atl

#endif  // ATOLL_SRC_STORE_FLAT_PARAMS_H_
