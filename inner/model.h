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
#include "inner/model_info.h"  // PlanOf, ParameterShapes, ParameterCount, ...

namespace atl::inner {

// The whole model of the config's family, initialized from model.init_seed on the CPU (the same
// at any parallelism).
CausalLm BuildModel(const ModelConfig& config);
// The module of a family registered at run time (inner::RegisterFamily, e.g. a test's); the
// built-in families' modules are known.
using ModuleBuilder = CausalLm (*)(const ModelConfig&);
absl::Status RegisterModule(const std::string& arch, ModuleBuilder build);
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
