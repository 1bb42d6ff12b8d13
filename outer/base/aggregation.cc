#include "outer/base/aggregation.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "compression/span_math.h"
#include "compression/status_macros.h"

namespace atl::outer {
namespace {

constexpr uint64_t kWindow = 4096;     // elements decoded per contribution at a time
constexpr uint64_t kSpan = 64 * kWindow;  // elements per task of the worker pool
constexpr uint64_t kSparseSpan = uint64_t(1) << 16;  // elements per task of a sparse fold

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

absl::Status ReadContribution(const ContributionRef& c, uint64_t a, uint64_t len, float* out) {
  if (auto s = c.payload->Read(a, len, out); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("contribution of island '", c.island, "': ",
                                               s.message()));
  }
  return absl::OkStatus();
}

// Runs span(first, count, task) over [0, n) in spans of `size` (kSpan unless given) on the pool
// (or here); the first failure in span order is returned.
absl::Status ForEachSpan(uint64_t n, WorkerPool* pool,
                         const std::function<absl::Status(uint64_t, uint64_t, size_t)>& span,
                         uint64_t size = kSpan) {
  const size_t spans = NumSpans(n, size);
  std::vector<absl::Status> status(spans);
  auto task = [&](size_t t) {
    const uint64_t first = t * size;
    status[t] = span(first, std::min(size, n - first), t);
  };
  if (pool != nullptr) {
    pool->ParallelFor(spans, task);
  } else {
    for (size_t t = 0; t < spans; ++t) task(t);
  }
  for (auto& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Token-weighted mean in double, in the given (island-id) order, each contribution scaled first,
// of elements [first, first + n) into out[n]. Each contribution is decoded a window at a time and
// folded into the window's sums at once; every element's result depends on that element alone.
absl::Status WeightedMean(const std::vector<ContributionRef>& in, const std::vector<double>& scale,
                          uint64_t first, uint64_t n, float* out, WorkerPool* pool) {
  double total = 0;
  for (const auto& c : in) total += double(c.tokens);
  return ForEachSpan(n, pool, [&](uint64_t span, uint64_t count, size_t) {
    std::vector<float> x(kWindow);
    std::vector<double> sum(kWindow);
    for (uint64_t a = span; a < span + count; a += kWindow) {
      const uint64_t len = std::min(kWindow, span + count - a);
      std::fill(sum.begin(), sum.end(), 0.0);
      for (size_t i = 0; i < in.size(); ++i) {
        ATL_RETURN_IF_ERROR(ReadContribution(in[i], first + a, len, x.data()));
        compression::FoldWeighted(x.data(), double(in[i].tokens), scale[i], sum.data(), len);
      }
      compression::StoreQuotient(sum.data(), total, out + a, len);
    }
    return absl::OkStatus();
  });
}

// WeightedMean's fold over the kept values alone: per span, each contribution's kept values are
// folded (in the given order) into the span's sums, and the touched coordinates read out in order.
absl::Status SparseWeightedMean(const std::vector<ContributionRef>& in,
                                const std::vector<double>& scale, uint64_t n, SparseGradient* out,
                                WorkerPool* pool) {
  double total = 0;
  for (const auto& c : in) total += double(c.tokens);
  out->Reset(NumSpans(n, kSparseSpan), kSparseSpan);
  auto span = [&](uint64_t first, uint64_t count, size_t t) -> absl::Status {
    // The sums stay zero between tasks: only the touched ones are reset.
    thread_local std::vector<double> sum_buffer(kSparseSpan, 0.0);
    thread_local std::vector<uint64_t> touched_buffer;
    double* const sum = sum_buffer.data();  // one lookup of each thread-local
    std::vector<uint64_t>& touched = touched_buffer;
    touched.assign(kSparseSpan / 64, 0);
    uint64_t* const bits = touched.data();
    for (size_t i = 0; i < in.size(); ++i) {
      const double weight = double(in[i].tokens), s = scale[i];
      const absl::Status read = in[i].payload->VisitKept(
          first, count, [&](uint64_t base, const uint32_t* index, const float* value, size_t m) {
            const uint64_t at = base - first;
            for (size_t j = 0; j < m; ++j) {
              const uint64_t k = at + index[j];
              sum[k] += weight * (double(value[j]) * s);  // as compression::FoldWeighted
              bits[k >> 6] |= uint64_t(1) << (k & 63);
            }
          });
      if (!read.ok()) {
        std::fill(sum_buffer.begin(), sum_buffer.end(), 0.0);
        return absl::Status(read.code(), absl::StrCat("contribution of island '", in[i].island,
                                                      "': ", read.message()));
      }
    }
    SparseGradient::Piece& piece = out->pieces[t];
    size_t m = 0;
    for (uint64_t w = 0; w < touched.size(); ++w) m += size_t(__builtin_popcountll(bits[w]));
    piece.index.resize(m);
    piece.value.resize(m);
    uint64_t* index = piece.index.data();
    float* value = piece.value.data();
    for (uint64_t w = 0; w < touched.size(); ++w) {
      for (uint64_t b = bits[w]; b != 0; b &= b - 1) {
        const uint64_t k = (w << 6) + uint64_t(__builtin_ctzll(b));
        *index++ = first + k;
        *value++ = float(sum[k] / total);  // as compression::StoreQuotient
        sum[k] = 0.0;
      }
    }
    return absl::OkStatus();
  };
  return ForEachSpan(n, pool, span, kSparseSpan);
}

// Per coordinate: sorts the M values (ties by island order), drops k at each end, averages the rest.
absl::Status TrimmedMean(const std::vector<ContributionRef>& in, size_t k, uint64_t n, float* out,
                         AggregationReport* report, WorkerPool* pool) {
  const size_t m = in.size();
  // Islands' dropped coordinates, per span (summed in span order afterwards).
  std::vector<std::vector<uint64_t>> dropped_per_span(NumSpans(n, kSpan), std::vector<uint64_t>(m));
  auto status = ForEachSpan(n, pool, [&](uint64_t first, uint64_t count, size_t t) {
    std::vector<float> values(m * kWindow);
    std::vector<std::pair<float, uint32_t>> column(m);
    std::vector<uint64_t>& dropped = dropped_per_span[t];
    for (uint64_t a = first; a < first + count; a += kWindow) {
      const uint64_t len = std::min(kWindow, first + count - a);
      for (size_t i = 0; i < m; ++i) {
        ATL_RETURN_IF_ERROR(ReadContribution(in[i], a, len, values.data() + i * kWindow));
      }
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
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (report != nullptr && k > 0 && n > 0) {
    // By chance an island is dropped in 2k / M of the coordinates.
    const double chance = double(2 * k) / double(m);
    for (size_t i = 0; i < m; ++i) {
      uint64_t dropped = 0;
      for (const auto& d : dropped_per_span) dropped += d[i];
      const double share = double(dropped) / double(n);
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

absl::Status ParseConfigValue(const std::string& text, AggregationRule* value) {
  ATL_ASSIGN_OR_RETURN(*value, ParseAggregationRule(text));
  return absl::OkStatus();
}

std::string ConfigValueText(AggregationRule value) { return AggregationRuleName(value); }

const char* AggregationRuleName(AggregationRule rule) {
  switch (rule) {
    case AggregationRule::kMean: return "mean";
    case AggregationRule::kClippedMean: return "clipped_mean";
    case AggregationRule::kTrimmedMean: return "trimmed_mean";
    case AggregationRule::kMedian: return "median";
  }
  return "unknown";
}

int SmallestIslands(const AggregationOptions& options) {
  switch (options.rule) {
    case AggregationRule::kMean: return 1;
    case AggregationRule::kClippedMean:
    case AggregationRule::kMedian: return 3;
    case AggregationRule::kTrimmedMean:
      for (int m = 3; m <= 4096; ++m) {
        if (std::floor(options.trim_fraction * double(m)) >= 1) return m;
      }
      return 0;
  }
  return 1;
}

absl::Status CheckActs(const AggregationOptions& options, int islands) {
  const int smallest = SmallestIslands(options);
  if (smallest > 0 && islands >= smallest) return absl::OkStatus();
  const std::string rule = AggregationRuleName(options.rule);
  if (options.rule == AggregationRule::kTrimmedMean) {
    const int k = int(std::floor(options.trim_fraction * double(islands)));
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.aggregation = trimmed_mean with outer.trim_fraction = ", options.trim_fraction,
        " and outer.islands = ", islands, " trims floor(", options.trim_fraction, " x ", islands,
        ") = ", k, " values at each end: it would be the mean. ",
        smallest > 0 ? absl::StrCat("It needs at least ", smallest, " islands at this fraction")
                     : std::string("A fraction of 0 never trims"),
        " (or use median, which needs 3)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "outer.aggregation = ", rule, " cannot outvote a faulty island with outer.islands = ", islands,
      ": with fewer than ", smallest, " contributions the ",
      options.rule == AggregationRule::kMedian ? "median is their mean"
                                                : "median norm it clips to is moved by the faulty one",
      "; it needs at least ", smallest, " islands (or use mean)"));
}

absl::Status CombineMean(const std::vector<ContributionRef>& contributions,
                         const std::vector<double>& scale, uint64_t first, uint64_t n, float* out,
                         WorkerPool* pool) {
  if (contributions.empty()) return absl::FailedPreconditionError("no contributions to combine");
  if (scale.size() != contributions.size()) {
    return absl::InvalidArgumentError(absl::StrCat(scale.size(), " scales for ",
                                                   contributions.size(), " contributions"));
  }
  return WeightedMean(contributions, scale, first, n, out, pool);
}

namespace {

absl::Status CheckCovered(const std::vector<ContributionRef>& contributions, uint64_t n) {
  if (contributions.empty()) return absl::FailedPreconditionError("no contributions to aggregate");
  for (const auto& c : contributions) {
    if (c.payload == nullptr || !c.payload->Covers(n)) {
      return absl::InvalidArgumentError(absl::StrCat("the contribution of island '", c.island,
                                                     "' does not cover the fragment's ", n,
                                                     " elements"));
    }
  }
  return absl::OkStatus();
}

// The mean rules' scale of each contribution: its discount, times clipped_mean's clip factor.
std::vector<double> MeanScales(const AggregationOptions& options,
                               const std::vector<ContributionRef>& contributions,
                               AggregationReport* report) {
  const size_t m = contributions.size();
  std::vector<double> scale(m, 1.0);
  for (size_t i = 0; i < m; ++i) scale[i] = contributions[i].discount;
  if (options.rule == AggregationRule::kClippedMean) {
    std::vector<double> norms;
    for (const auto& c : contributions) norms.push_back(c.norm);
    const double bound = options.clip_multiple * Median(norms);
    for (size_t i = 0; i < m; ++i) {
      if (contributions[i].norm > bound) {
        scale[i] *= bound / contributions[i].norm;
        if (report != nullptr) {
          report->clipped.push_back(contributions[i].island);
          report->outliers.push_back(contributions[i].island);
        }
      }
    }
  }
  if (report != nullptr) report->scales = scale;
  return scale;
}

}  // namespace

bool AggregatesSparsely(const AggregationOptions& options,
                        const std::vector<ContributionRef>& contributions) {
  if (!FoldsWholeContributions(options.rule)) return false;
  for (const auto& c : contributions) {
    if (c.payload == nullptr || !c.payload->codec.sparse()) return false;
  }
  return !contributions.empty();
}

void SparseGradient::Reset(size_t n, uint64_t span_elements) {
  span = span_elements;
  pieces.resize(n);
  for (auto& p : pieces) {
    p.index.clear();
    p.value.clear();
  }
}

size_t SparseGradient::size() const {
  size_t n = 0;
  for (const auto& p : pieces) n += p.index.size();
  return n;
}

absl::Status AggregateSparse(const AggregationOptions& options,
                             const std::vector<ContributionRef>& contributions, uint64_t n,
                             AggregationReport* report, SparseGradient* out, WorkerPool* pool) {
  ATL_RETURN_IF_ERROR(CheckCovered(contributions, n));
  if (!AggregatesSparsely(options, contributions)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AggregationRuleName(options.rule), " over these contributions is not sparse"));
  }
  return SparseWeightedMean(contributions, MeanScales(options, contributions, report), n, out,
                            pool);
}

absl::Status Aggregate(const AggregationOptions& options,
                       const std::vector<ContributionRef>& contributions, uint64_t n, float* out,
                       AggregationReport* report, WorkerPool* pool) {
  ATL_RETURN_IF_ERROR(CheckCovered(contributions, n));
  const size_t m = contributions.size();
  switch (options.rule) {
    case AggregationRule::kMean:
    case AggregationRule::kClippedMean:
      return WeightedMean(contributions, MeanScales(options, contributions, report), 0, n, out,
                          pool);
    case AggregationRule::kTrimmedMean: {
      const size_t k = std::min(size_t(std::floor(options.trim_fraction * double(m))), (m - 1) / 2);
      return TrimmedMean(contributions, k, n, out, report, pool);
    }
    case AggregationRule::kMedian:
      return TrimmedMean(contributions, (m - 1) / 2, n, out, report, pool);
  }
  return absl::InvalidArgumentError("unknown aggregation rule");
}

}  // namespace atl::outer
