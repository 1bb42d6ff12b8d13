// The service's starting point: the run's parameters (atoll's model of config.model, or a module
// atoll does not build), their fragments and initial values.
#include <torch/torch.h>

#include <functional>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "inner/model.h"
#include "outer/base/fragments.h"
#include "outer/service/service_options.h"
#include "src/service/coordinator.h"
#include "src/service/loss_probe.h"
#include "src/store/flat_params.h"
#include "src/store/model_io.h"

namespace atl {

namespace {

// What the service starts from: each parameter's name, size and initial values (flat, in the
// canonical order), and its fragment group.
struct RunParameters {
  outer::FragmentLayout layout;
  // Parameter i's values, made when asked: only for the fragments a server holds (a sharded
  // run's coordinator holds none).
  std::function<std::vector<float>(size_t)> values;
  std::vector<int> groups;
  uint64_t config_hash = 0;
};

absl::StatusOr<RunParameters> ParametersOf(const Config& config, const ModuleParams* module) {
  RunParameters run;
  if (module != nullptr) {
    run.layout = module->layout;
    if (module->values.size() != run.layout.total()) {
      return absl::InvalidArgumentError(absl::StrCat("the module's values hold ", module->values.size(),
                                                     " elements, its parameters ",
                                                     run.layout.total()));
    }
    std::vector<size_t> offsets{0};
    for (uint64_t n : run.layout.numels) offsets.push_back(offsets.back() + n);
    run.values = [module, offsets](size_t i) {
      return std::vector<float>(module->values.begin() + offsets[i],
                                module->values.begin() + offsets[i + 1]);
    };
    run.groups = outer::ContiguousGroups(run.layout.numels, config.outer.num_fragments);
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (size_t i = 0; i < run.layout.names.size(); ++i) {
      shapes.emplace_back(run.layout.names[i], i < module->shapes.size() ? module->shapes[i]
                                                                          : std::vector<int64_t>());
    }
    run.config_hash = LayoutHash(shapes);
    return run;
  }
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
  ATL_ASSIGN_OR_RETURN(RunParameters run, ParametersOf(config, module));
  outer::SyncServerOptions o = outer::ServiceOptions(
      config.outer,
      {uint64_t(config.train.steps),
       module != nullptr && module->tokens_per_step > 0 ? module->tokens_per_step
                                                        : config.tokens_per_rank_step(),
       run.config_hash},
      shard);
  ATL_ASSIGN_OR_RETURN(auto plan, outer::PlanFragments(run.groups, config.outer.num_fragments,
                                                       config.outer.fragment_pattern));
  std::vector<outer::FragmentLayout> layouts;
  std::vector<std::vector<float>> initial;
  for (const auto& indices : plan.parameters) {
    outer::FragmentLayout l;
    std::vector<float> values;
    // A sharded service: the coordinator and each shard keep only the fragments they hold.
    const bool owned = outer::ShardOwns(o, uint32_t(layouts.size()));
    for (size_t i : indices) {
      l.names.push_back(run.layout.names[i]);
      l.numels.push_back(run.layout.numels[i]);
      if (owned) {
        const std::vector<float> v = run.values(i);
        values.insert(values.end(), v.begin(), v.end());
      }
    }
    initial.push_back(std::move(values));
    layouts.push_back(std::move(l));
  }
  if (o.scoring.loss_probe) {
    if (module != nullptr) {
      return absl::FailedPreconditionError(
          "outer.scoring = loss_probe runs atoll's model on the service: a module atoll does not "
          "build cannot be probed");
    }
    ATL_ASSIGN_OR_RETURN(o.loss_probe, MakeLossProbe(config, plan.parameters, initial));
  }
  return std::make_unique<outer::SyncServer>(o, std::move(layouts), std::move(initial));
}

}  // namespace atl
