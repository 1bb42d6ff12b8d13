#include "outer/service/sync_types.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace atl::outer {

uint32_t DynamicLocalSteps(double v, double v_max, uint32_t h) {
  if (!(v > 0) || !(v_max > 0) || v >= v_max) return h;
  return std::max<uint32_t>(1, uint32_t(std::floor(v / v_max * double(h))));
}

bool ShardOwns(const SyncServerOptions& options, uint32_t fragment) {
  return options.num_shards <= 1 ||
         (options.shard >= 0 && fragment % options.num_shards == uint32_t(options.shard));
}

uint64_t FragmentLayout::total() const {
  return std::accumulate(numels.begin(), numels.end(), uint64_t(0));
}

absl::Status ValidateTelemetry(const pb::IslandTelemetry& t) {
  const std::pair<const char*, std::pair<double, double>> bounds[] = {
      {"loss", {t.loss(), 1e4}},
      {"val_loss", {t.val_loss(), 1e4}},
      {"val_bpb", {t.val_bpb(), 1e4}},
      {"tokens_per_s", {t.tokens_per_s(), 1e12}},
      {"utilization", {t.utilization(), 1}}};
  for (const auto& [name, value_max] : bounds) {
    const auto [value, max] = value_max;
    if (!(value >= 0 && value <= max)) {  // NaN fails too
      return absl::InvalidArgumentError(
          absl::StrCat("heartbeat telemetry: ", name, " = ", value, " is not in [0, ", max, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
