// The [parallelism] section: the mesh of an island's ranks and how a step runs over it.
// Torch-free; checked against the model when the config loads.
#ifndef ATOLL_INNER_PARALLEL_PARALLELISM_CONFIG_H_
#define ATOLL_INNER_PARALLEL_PARALLELISM_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "inner/model_config.h"
#include "inner/train_config.h"

namespace atl::inner::parallel {

// The order a step's pipeline micro-batches run through the stages (inner/parallel/pipeline.h).
enum class PipelineSchedule { kGPipe, k1F1B };
// "GPipe" or "1F1B", in any case.
absl::Status ParseConfigValue(const std::string& text, PipelineSchedule* value);
std::string ConfigValueText(PipelineSchedule value);
const char* PipelineScheduleName(PipelineSchedule schedule);

// -1 takes the ranks the other degrees leave.
struct ParallelismConfig {
  static constexpr const char* kSection = "parallelism";
  int data_parallel_replicate_degree = 1;
  int data_parallel_shard_degree = -1;  // FSDP (ZeRO-3)
  int tensor_parallel_degree = 1;
  // Tensor parallelism's sequence parallelism (inner/model.h): the blocks' LayerNorms, dropouts
  // and residual stream hold 1/tp of each sequence. Nothing to do with tp = 1.
  bool sequence_parallel = false;
  int pipeline_parallel_degree = 1;
  // Each micro-batch splits into this many pipeline micro-batches (of train.batch_size / this
  // sequences), which run through the stages in `pipeline_schedule`; a step's grad_accum x
  // pipeline_microbatches of them form one pipeline.
  int pipeline_microbatches = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::k1F1B;
  double collective_timeout_s = 60;  // every collective inside the island
};

template <class V>
void VisitKeys(ParallelismConfig& c, V&& v) {
  v("data_parallel_shard_degree", c.data_parallel_shard_degree,
    "FSDP ranks of an island (-1: the ranks the other degrees leave)");
  v("data_parallel_replicate_degree", c.data_parallel_replicate_degree,
    "replicated data-parallel groups (HSDP)");
  v("tensor_parallel_degree", c.tensor_parallel_degree, "tensor-parallel ranks");
  v("enable_sequence_parallel", c.sequence_parallel,
    "tensor parallelism also splits the blocks' norms, dropouts and residual stream over the "
    "sequence (1/tp of those activations per rank)");
  v("pipeline_parallel_degree", c.pipeline_parallel_degree, "pipeline stages");
  v("pipeline_parallel_microbatches", c.pipeline_microbatches,
    "pipeline micro-batches per micro-batch (each of train.batch_size / this sequences)");
  v("pipeline_parallel_schedule", c.pipeline_schedule, "\"GPipe\" or \"1F1B\"");
  v("collective_timeout_s", c.collective_timeout_s,
    "a collective inside an island fails after this long (a rank gone)");
}

absl::Status Validate(const ParallelismConfig& config);
// Every pipeline stage needs a block: names the degree and the layer count when it cannot.
absl::Status ValidatePipeline(int n_layer, int stages);
// Tied embeddings (model.tie_embeddings) under `dp_shard` FSDP shards and `pp` stages (-1, the
// rest of the ranks, is judged where the mesh is resolved: inner::parallel::FsdpModel::Create).
absl::Status ValidateTiedEmbeddings(const ModelConfig& model, int dp_shard, int pp);
// What the mesh asks of the model and the batch, checked before any rank starts.
absl::Status ValidateForModel(const ParallelismConfig& config, const ModelConfig& model,
                              const TrainConfig& train);

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_PARALLELISM_CONFIG_H_
