// What is known of the config's model without building it: its family's parallelization plan,
// every parameter's name and shape, their count, its training FLOPs, and what keeps it from
// splitting over tensor-parallel ranks. Torch-free: configs, plans, the outer-sync service and the
// Python package's core use it without libtorch (the module itself: inner/model.h).
#ifndef ATOLL_INNER_MODEL_INFO_H_
#define ATOLL_INNER_MODEL_INFO_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "inner/model/plan.h"
#include "inner/model_config.h"

namespace atl::inner {

// Its family's parallelization plan.
ParallelPlan PlanOf(const ModelConfig& config);

// Every parameter's name and shape in registration order, by closed form (tools that map or check
// weights need them without building the module).
std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(const ModelConfig& config);

// Their sum (tests check the module against it).
int64_t ParameterCount(const ModelConfig& config);

// Training FLOPs per token, for isoflop accounting and utilization.
double TrainFlopsPerToken(const ModelConfig& config);

// Names what keeps the model from splitting over `tp` tensor-parallel ranks.
absl::Status ValidateTensorParallel(const ModelConfig& config, int tp,
                                    bool sequence_parallel = false);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_INFO_H_
