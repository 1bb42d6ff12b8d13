#include "inner/parallel/parallelism_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"
#include "inner/model_info.h"

namespace atl::inner::parallel {
namespace {

constexpr EnumName<PipelineSchedule> kSchedules[] = {{PipelineSchedule::kGPipe, "GPipe"},
                                                     {PipelineSchedule::k1F1B, "1F1B"}};

}  // namespace

absl::Status ParseConfigValue(const std::string& text, PipelineSchedule* value) {
  return ParseEnumValue(text, kSchedules, value, /*any_case=*/true);
}
std::string ConfigValueText(PipelineSchedule value) { return EnumValueName(value, kSchedules); }
const char* PipelineScheduleName(PipelineSchedule schedule) {
  return EnumValueName(schedule, kSchedules);
}

absl::Status Validate(const ParallelismConfig& c) {
  int rest = 0;
  for (auto [key, v] : {std::pair<const char*, int>{"parallelism.data_parallel_replicate_degree",
                                                    c.data_parallel_replicate_degree},
                        {"parallelism.data_parallel_shard_degree", c.data_parallel_shard_degree},
                        {"parallelism.tensor_parallel_degree", c.tensor_parallel_degree},
                        {"parallelism.pipeline_parallel_degree", c.pipeline_parallel_degree}}) {
    if (v == -1) {
      ++rest;
    } else if (v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " must be a positive degree or -1 (the rest), got ", v));
    }
  }
  if (rest > 1) {
    return absl::InvalidArgumentError("at most one parallelism degree may be -1 (the rest)");
  }
  if (!(c.collective_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.collective_timeout_s must be positive, got ", c.collective_timeout_s));
  }
  return absl::OkStatus();
}

absl::Status ValidateTiedEmbeddings(const ModelConfig& model, int dp_shard, int pp) {
  if (!model.tie_embeddings || (dp_shard <= 1 && pp <= 1)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model.tie_embeddings needs the embedding matrix whole where the head is: it works with "
      "tensor parallelism and replicas, not with FSDP sharding (parallelism.data_parallel_shard_degree = ",
      dp_shard, ") or pipeline stages (parallelism.pipeline_parallel_degree = ", pp,
      "), which put the embeddings and the head in different units"));
}

absl::Status ValidateForModel(const ParallelismConfig& c, const ModelConfig& model,
                              const TrainConfig& train) {
  if (c.pipeline_microbatches <= 0 || train.batch_size % c.pipeline_microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.pipeline_parallel_microbatches must be positive and divide train.batch_size = ",
        train.batch_size, ", got ", c.pipeline_microbatches));
  }
  if (c.pipeline_parallel_degree > 1) {
    ATL_RETURN_IF_ERROR(ValidatePipeline(model.n_layer, c.pipeline_parallel_degree));
  }
  ATL_RETURN_IF_ERROR(ValidateTiedEmbeddings(model, c.data_parallel_shard_degree,
                                             c.pipeline_parallel_degree));
  if (c.tensor_parallel_degree > 1) {
    return ValidateTensorParallel(model, c.tensor_parallel_degree, c.sequence_parallel);
  }
  return absl::OkStatus();
}

absl::Status ValidatePipeline(int n_layer, int stages) {
  if (stages < 1 || stages > n_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallelism.pipeline_parallel_degree = ", stages, " needs at least one block per stage: "
        "model.n_layer = ", n_layer, " allows at most ", n_layer));
  }
  return absl::OkStatus();
}

}  // namespace atl::inner::parallel
