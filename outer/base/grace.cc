#include "outer/base/grace.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace atl::outer {
namespace {

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + long(mid)));
}

}  // namespace

absl::Status ParseConfigValue(const std::string& text, GraceSpec* value) {
  if (text == "adaptive" || text == "off") {
    *value = {text == "off" ? GraceSpec::Mode::kOff : GraceSpec::Mode::kAdaptive, 0};
    return absl::OkStatus();
  }
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !std::isfinite(seconds) || seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "must be \"adaptive\", \"off\" or seconds >= 0 (e.g. \"2.5\"), got \"", text, "\""));
  }
  *value = {GraceSpec::Mode::kSeconds, seconds};
  return absl::OkStatus();
}

std::string ConfigValueText(const GraceSpec& value) {
  switch (value.mode) {
    case GraceSpec::Mode::kOff:
      return "off";
    case GraceSpec::Mode::kAdaptive:
      return "adaptive";
    case GraceSpec::Mode::kSeconds:
      break;
  }
  return absl::StrFormat("%g", value.seconds);
}

void ArrivalHistory::Add(double spread_s, double period_s) {
  if (!(period_s > 0) || !(spread_s >= 0) || !std::isfinite(spread_s / period_s)) return;
  ratios_.push_back(spread_s / period_s);
  while (ratios_.size() > kGraceHistory) ratios_.pop_front();
}

std::optional<double> ArrivalHistory::Window(const GraceSpec& spec, double period_s,
                                             double floor_s) const {
  if (spec.mode == GraceSpec::Mode::kSeconds) return spec.seconds;
  if (spec.mode == GraceSpec::Mode::kOff || !(period_s > 0)) return std::nullopt;
  if (ratios_.size() < kGraceMinRounds) return std::nullopt;
  const std::vector<double> ratios(ratios_.begin(), ratios_.end());
  const double median = Median(ratios);
  std::vector<double> deviations;
  for (double r : ratios) deviations.push_back(std::abs(r - median));
  const double mad = Median(deviations);
  const double ratio = median + kGraceK * mad + kGraceSlack;
  return std::max(floor_s, ratio * period_s);
}

}  // namespace atl::outer
