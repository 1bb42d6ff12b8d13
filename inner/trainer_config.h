// The config sections a trainer (inner/trainer.h) is made from, torch-free.
#ifndef ATOLL_INNER_TRAINER_CONFIG_H_
#define ATOLL_INNER_TRAINER_CONFIG_H_

#include "inner/model_config.h"
#include "inner/parallel/parallelism_config.h"
#include "inner/train_config.h"

namespace atl::inner {

struct TrainerConfig {
  ModelConfig model;
  OptimConfig optim;
  TrainConfig train;
  ActivationCheckpointConfig activation_checkpoint;
  parallel::ParallelismConfig parallelism;
};

}  // namespace atl::inner

#endif  // ATOLL_INNER_TRAINER_CONFIG_H_
