// The service's loss probe (outer.scoring = "loss_probe", outer/base/scoring.h): atoll's model of
// the run's [model] on the service's CPU, and a fixed held-out batch: the last
// outer.probe_batches x train.batch_size windows of the validation data (the evaluation's first
// windows are its own), in order.
#ifndef ATOLL_SRC_SERVICE_LOSS_PROBE_H_
#define ATOLL_SRC_SERVICE_LOSS_PROBE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/scoring.h"
#include "src/config/config.h"

namespace atl {

// `fragments`: each fragment's parameters (indices in the model's order), as the service plans
// them; `initial`: each fragment's starting values (flat, canonical order).
absl::StatusOr<std::shared_ptr<outer::LossProbe>> MakeLossProbe(
    const Config& config, const std::vector<std::vector<size_t>>& fragments,
    const std::vector<std::vector<float>>& initial);

}  // namespace atl

#endif  // ATOLL_SRC_SERVICE_LOSS_PROBE_H_
