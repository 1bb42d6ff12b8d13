#include "inner/loop_parts.h"

#include <cmath>
#include <optional>

#include "compression/status_macros.h"

namespace atl::inner {

absl::Status SpikeCheck::OnStats(const std::vector<StepStats>& steps) {
  std::optional<std::string> spike;
  int64_t spike_step = 0;
  bool finite = true;
  for (const auto& step : steps) {
    if (!spike && (spike = guard_.Check(step.loss))) spike_step = step.step;
    finite = finite && std::isfinite(step.loss);
  }
  return spike ? on_spike_(spike_step, *spike, finite) : absl::OkStatus();
}

absl::StatusOr<bool> StopSignal::Stop(int64_t) {
  ATL_ASSIGN_OR_RETURN(stopped_, requested_());
  return stopped_;
}

}  // namespace atl::inner
