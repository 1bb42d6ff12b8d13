// The model atoll trains, whatever its family (inner/model/causal_lm.h): built from the [model]
// section, its parameters in stable named order (fragments of the outer sync and checkpoints are
// defined by them), its canonical flat order and its parallelization plan.
#ifndef ATOLL_INNER_MODEL_H_
#define ATOLL_INNER_MODEL_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "inner/model/causal_lm.h"
#include "inner/model/plan.h"
#include "inner/model_config.h"

namespace atl::inner {

// The whole model of the config's family, initialized from model.init_seed on the CPU.
CausalLm BuildModel(const ModelConfig& config);
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

// The canonical flat order (inner/model/plan.h). `flat` (1-D, in canonical order) seen as the
// parameter of `shape` (a view), and the parameter in canonical order (1-D; a copy when its
// memory is in another order).
torch::Tensor ShapedView(const ParamPlan& plan, const torch::Tensor& flat,
                         torch::IntArrayRef shape);
torch::Tensor CanonicalFlat(const ParamPlan& plan, const torch::Tensor& param);
// Rank `rank`'s part of the whole parameter `whole` (a copy, of TpLocalShape).
torch::Tensor TpLocalPart(const ParamPlan& plan, const torch::Tensor& whole, int rank, int size);

// Parameters in registration order with their stable names.
std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(torch::nn::Module& module);

}  // namespace atl::inner

#endif  // ATOLL_INNER_MODEL_H_
