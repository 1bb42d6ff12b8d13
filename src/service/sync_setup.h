// The run's SyncServer from its parameters: a module's (atoll does not build it: the Python
// package's) or atoll's model's (src/service/initial_state.h, the torch side). Torch-free: the
// coordinator's host (src/service/coordinator.h) links it without libtorch.
#ifndef ATOLL_SRC_SERVICE_SYNC_SETUP_H_
#define ATOLL_SRC_SERVICE_SYNC_SETUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/scoring.h"
#include "outer/service/sync_server.h"
#include "src/config/config.h"

namespace atl {

// A model atoll does not build (a Python module), served in place of config.model: its
// parameters' names and sizes in order, their shapes, their initial values flat (each row-major).
// Its fragments are contiguous runs of parameters (outer::ContiguousGroups); islands present its
// LayoutHash.
struct ModuleParams {
  outer::FragmentLayout layout;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<float> values;
  // The most tokens an island's rank trains per inner step (what contributions are weighed by at
  // most); 0: config's [train] batch x grad_accum x model.context.
  uint64_t tokens_per_step = 0;
};

// What the service starts from: each parameter's name, size and initial values (flat, in the
// canonical order), and its fragment group.
struct RunParameters {
  outer::FragmentLayout layout;
  // Parameter i's values, made when asked: only for the fragments a server holds (a sharded
  // run's coordinator holds none).
  std::function<std::vector<float>(size_t)> values;
  std::vector<int> groups;
  uint64_t config_hash = 0;
  uint64_t tokens_per_step = 0;  // as ModuleParams's (0: the config's)
};

// A module's parameters, checked (`module` outlives what is returned).
absl::StatusOr<RunParameters> ModuleParameters(const Config& config, const ModuleParams& module);

// outer.scoring = "loss_probe": the probe of atoll's model (src/service/loss_probe.h), given each
// fragment's parameters (indices in the model's order) and starting values.
using LossProbeMaker = std::function<absl::StatusOr<std::shared_ptr<outer::LossProbe>>(
    const Config&, const std::vector<std::vector<size_t>>& fragments,
    const std::vector<std::vector<float>>& initial)>;

// The run's SyncServer over `run`: with outer.num_fragments > 1 one fragment per group
// (outer/base/fragments.h). `shard`: with outer.shards > 1, the coordinator
// (SyncServerOptions::kControlPlane, no fragment's data) or shard server K (its fragments' data
// only). `probe`: null refuses outer.scoring = "loss_probe".
absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeSyncServerFrom(const Config& config,
                                                                      int shard,
                                                                      const RunParameters& run,
                                                                      const LossProbeMaker& probe);

// The SyncServer of a module's run (no loss probe); refused without a module: atoll's own model
// is built by the torch side (src/service/initial_state.h), which `atoll coordinator` links.
absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeModuleSyncServer(const Config& config,
                                                                        int shard,
                                                                        const ModuleParams* module);

}  // namespace atl

#endif  // ATOLL_SRC_SERVICE_SYNC_SETUP_H_
