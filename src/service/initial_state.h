// The service's starting point on the torch side: atoll's model of config.model built, its
// parameters and their fragments, the loss probe.
#ifndef ATOLL_SRC_SERVICE_INITIAL_STATE_H_
#define ATOLL_SRC_SERVICE_INITIAL_STATE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "outer/service/sync_server.h"
#include "src/config/config.h"
#include "src/service/sync_setup.h"

namespace atl {

// The run's SyncServer: global parameters initialized from model.init_seed, or read from
// train.init_from when set; layout from the model's named parameters (or those of `module`).
// `shard` as MakeSyncServerFrom's.
absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeSyncServer(
    const Config& config, int shard = outer::SyncServerOptions::kControlPlane,
    const ModuleParams* module = nullptr);

}  // namespace atl

#endif  // ATOLL_SRC_SERVICE_INITIAL_STATE_H_
