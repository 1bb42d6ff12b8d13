#include "src/service/initial_state.h"

#include <torch/torch.h>

#include "compression/status_macros.h"
#include "inner/model.h"
#include "src/service/loss_probe.h"
#include "src/store/flat_params.h"
#include "src/store/model_io.h"

namespace atl {

namespace {

// Atoll's model of config.model: its parameters from model.init_seed, or train.init_from.
absl::StatusOr<RunParameters> ModelParameters(const Config& config) {
  RunParameters run;
  // The model's tensors live only while the owned parameters are copied out: the service's
  // memory never holds them twice once it runs.
  const inner::CausalLm model = inner::BuildModel(config.model);
  NamedParams params = inner::NamedParameters(*model);
  if (!config.train.init_from.empty()) {
    ATL_ASSIGN_OR_RETURN(auto weights, InitialWeights(config));
    ATL_RETURN_IF_ERROR(CopyInto(weights, params));
  }
  run.layout = LayoutOf(params);
  const inner::ParallelPlan plan = inner::PlanOf(config.model);
  run.groups = inner::FragmentGroups(plan, run.layout.names);
  run.values = [plan, params = std::move(params)](size_t i) { return Flatten(plan, params, {i}); };
  run.config_hash = ModelConfigHash(config.model);
  return run;
}

}  // namespace

absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeSyncServer(const Config& config, int shard,
                                                                  const ModuleParams* module) {
  if (module != nullptr) return MakeModuleSyncServer(config, shard, module);
  ATL_ASSIGN_OR_RETURN(RunParameters run, ModelParameters(config));
  return MakeSyncServerFrom(config, shard, run, MakeLossProbe);
}

}  // namespace atl
