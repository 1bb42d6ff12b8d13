#include "inner/model_info.h"

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/model/family.h"

namespace atl::inner {

ParallelPlan PlanOf(const ModelConfig& config) { return FamilyOf(config).plan(config); }

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(const ModelConfig& c) {
  return FamilyOf(c).shapes(c);
}

int64_t ParameterCount(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& [name, shape] : ParameterShapes(c)) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    n += numel;
  }
  return n;
}

double TrainFlopsPerToken(const ModelConfig& c) { return FamilyOf(c).train_flops_per_token(c); }

// What any family needs (a positive degree; sequence parallelism splits every sequence's
// positions), then what its own layers split.
absl::Status ValidateTensorParallel(const ModelConfig& c, int tp, bool sequence_parallel) {
  if (tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel degree must be positive, got ", tp));
  }
  ATL_RETURN_IF_ERROR(FamilyOf(c).validate_tensor_parallel(c, tp));
  if (sequence_parallel && c.context % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.enable_sequence_parallel needs model.context (", c.context,
        ") to divide by parallelism.tensor_parallel_degree = ", tp,
        ": each rank holds context / ", tp, " positions of every sequence"));
  }
  return absl::OkStatus();
}

}  // namespace atl::inner
