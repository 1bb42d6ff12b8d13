#include "src/service/sync_setup.h"

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/base/fragments.h"
#include "outer/service/service_options.h"
#include "src/store/model_hashes.h"

namespace atl {

absl::StatusOr<RunParameters> ModuleParameters(const Config& config, const ModuleParams& module) {
  RunParameters run;
  run.layout = module.layout;
  if (module.values.size() != run.layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat("the module's values hold ", module.values.size(),
                                                   " elements, its parameters ",
                                                   run.layout.total()));
  }
  std::vector<size_t> offsets{0};
  for (uint64_t n : run.layout.numels) offsets.push_back(offsets.back() + n);
  run.values = [&module, offsets](size_t i) {
    return std::vector<float>(module.values.begin() + offsets[i],
                              module.values.begin() + offsets[i + 1]);
  };
  run.groups = outer::ContiguousGroups(run.layout.numels, config.outer.num_fragments);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (size_t i = 0; i < run.layout.names.size(); ++i) {
    shapes.emplace_back(run.layout.names[i], i < module.shapes.size() ? module.shapes[i]
                                                                        : std::vector<int64_t>());
  }
  run.config_hash = LayoutHash(shapes);
  run.tokens_per_step = module.tokens_per_step;
  return run;
}

absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeSyncServerFrom(const Config& config,
                                                                      int shard,
                                                                      const RunParameters& run,
                                                                      const LossProbeMaker& probe) {
  outer::SyncServerOptions o = outer::ServiceOptions(
      config.outer,
      {uint64_t(config.train.steps),
       run.tokens_per_step > 0 ? run.tokens_per_step : config.tokens_per_rank_step(),
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
    if (!probe) {
      return absl::FailedPreconditionError(
          "outer.scoring = loss_probe runs atoll's model on the service: a module atoll does not "
          "build cannot be probed");
    }
    ATL_ASSIGN_OR_RETURN(o.loss_probe, probe(config, plan.parameters, initial));
  }
  return std::make_unique<outer::SyncServer>(o, std::move(layouts), std::move(initial));
}

absl::StatusOr<std::unique_ptr<outer::SyncServer>> MakeModuleSyncServer(const Config& config,
                                                                        int shard,
                                                                        const ModuleParams* module) {
  if (module == nullptr) {
    return absl::FailedPreconditionError(
        "this coordinator serves a module's parameters only (atoll.Coordinator(model=...)); a run "
        "of atoll's own model ([model]) is served by `atoll coordinator`");
  }
  ATL_ASSIGN_OR_RETURN(RunParameters run, ModuleParameters(config, *module));
  return MakeSyncServerFrom(config, shard, run, nullptr);
}

}  // namespace atl
