#include "outer/aggregation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace atl::outer {
namespace {

constexpr uint64_t kWindow = 4096;  // elements decoded per contribution at a time

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// Decodes elements [a, a + len) of every contribution into values[i * kWindow ...].
absl::Status ReadWindow(const std::vector<ContributionRef>& in, uint64_t a, uint64_t len,
                        std::vector<float>& values) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (auto s = in[i].payload->Read(a, len, values.data() + i * kWindow); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("contribution of island '", in[i].island, "': ",
                                                 s.message()));
    }
  }
  return absl::OkStatus();
}

// Token-weighted mean in double, in the given (island-id) order, each contribution scaled first.
absl::Status WeightedMean(const std::vector<ContributionRef>& in, const std::vector<double>& scale,
                          uint64_t n, float* out) {
  double total = 0;
  for (const auto& c : in) total += double(c.tokens);
  std::vector<float> values(in.size() * kWindow);
  std::vector<double> sum(kWindow);
  for (uint64_t a = 0; a < n; a += kWindow) {
    const uint64_t len = std::min(kWindow, n - a);
    if (auto s = ReadWindow(in, a, len, values); !s.ok()) return s;
    std::fill(sum.begin(), sum.end(), 0.0);
    for (size_t i = 0; i < in.size(); ++i) {
      const double w = double(in[i].tokens);
      const float* x = values.data() + i * kWindow;
      if (scale[i] == 1.0) {
        for (uint64_t j = 0; j < len; ++j) sum[j] += w * double(x[j]);
      } else {
        for (uint64_t j = 0; j < len; ++j) sum[j] += w * (double(x[j]) * scale[i]);
      }
    }
    for (uint64_t j = 0; j < len; ++j) out[a + j] = float(sum[j] / total);
  }
  return absl::OkStatus();
}

// Per coordinate: sorts the M values (ties by island order), drops k at each end, averages the rest.
absl::Status TrimmedMean(const std::vector<ContributionRef>& in, size_t k, uint64_t n, float* out,
                         AggregationReport* report) {
  const size_t m = in.size();
  std::vector<float> values(m * kWindow);
  std::vector<std::pair<float, uint32_t>> column(m);
  std::vector<uint64_t> dropped(m, 0);
  for (uint64_t a = 0; a < n; a += kWindow) {
    const uint64_t len = std::min(kWindow, n - a);
    if (auto s = ReadWindow(in, a, len, values); !s.ok()) return s;
    for (uint64_t j = 0; j < len; ++j) {
      for (size_t i = 0; i < m; ++i) column[i] = {values[i * kWindow + j], uint32_t(i)};
      std::sort(column.begin(), column.end());
      double sum = 0;
      for (size_t r = k; r < m - k; ++r) sum += double(column[r].first);
      out[a + j] = float(sum / double(m - 2 * k));
      for (size_t r = 0; r < k; ++r) {
        ++dropped[column[r].second];
        ++dropped[column[m - 1 - r].second];
      }
    }
  }
  if (report != nullptr && k > 0 && n > 0) {
    // By chance an island is dropped in 2k / M of the coordinates.
    const double chance = double(2 * k) / double(m);
    for (size_t i = 0; i < m; ++i) {
      const double share = double(dropped[i]) / double(n);
      report->trimmed[in[i].island] = share;
      if (share >= 0.5 * (1.0 + chance)) report->outliers.push_back(in[i].island);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AggregationRule> ParseAggregationRule(const std::string& name) {
  for (AggregationRule r : {AggregationRule::kMean, AggregationRule::kClippedMean,
                            AggregationRule::kTrimmedMean, AggregationRule::kMedian}) {
    if (name == AggregationRuleName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown aggregation '", name, "' (one of mean, clipped_mean, trimmed_mean, median)"));
}

const char* AggregationRuleName(AggregationRule rule) {
  switch (rule) {
    case AggregationRule::kMean: return "mean";
    case AggregationRule::kClippedMean: return "clipped_mean";
    case AggregationRule::kTrimmedMean: return "trimmed_mean";
    case AggregationRule::kMedian: return "median";
  }
  return "unknown";
}

absl::Status Aggregate(const AggregationOptions& options,
                       const std::vector<ContributionRef>& contributions, uint64_t n, float* out,
                       AggregationReport* report) {
  const size_t m = contributions.size();
  if (m == 0) return absl::FailedPreconditionError("no contributions to aggregate");
  for (const auto& c : contributions) {
    if (c.payload == nullptr || !c.payload->Covers(n)) {
      return absl::InvalidArgumentError(absl::StrCat("the contribution of island '", c.island,
                                                     "' does not cover the fragment's ", n,
                                                     " elements"));
    }
  }
  std::vector<double> scale(m, 1.0);
  switch (options.rule) {
    case AggregationRule::kMean:
      return WeightedMean(contributions, scale, n, out);
    case AggregationRule::kClippedMean: {
      std::vector<double> norms;
      for (const auto& c : contributions) norms.push_back(c.norm);
      const double bound = options.clip_multiple * Median(norms);
      for (size_t i = 0; i < m; ++i) {
        if (contributions[i].norm > bound) {
          scale[i] = bound / contributions[i].norm;
          if (report != nullptr) {
            report->clipped.push_back(contributions[i].island);
            report->outliers.push_back(contributions[i].island);
          }
        }
      }
      return WeightedMean(contributions, scale, n, out);
    }
    case AggregationRule::kTrimmedMean: {
      const size_t k = std::min(size_t(std::floor(options.trim_fraction * double(m))), (m - 1) / 2);
      return TrimmedMean(contributions, k, n, out, report);
    }
    case AggregationRule::kMedian:
      return TrimmedMean(contributions, (m - 1) / 2, n, out, report);
  }
  return absl::InvalidArgumentError("unknown aggregation rule");
}

}  // namespace atl::outer
