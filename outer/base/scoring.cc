#include "outer/base/scoring.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace atl::outer {

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// The paired t statistic of d - m over the rows (0 when they never differ).
double PairedT(const std::vector<double>& d, const std::vector<double>& m) {
  const size_t rows = d.size();
  if (rows < 2) return 0;
  std::vector<double> diff(rows);
  for (size_t r = 0; r < rows; ++r) diff[r] = d[r] - m[r];
  const double mean = MeanOf(diff);
  double squares = 0;
  for (double x : diff) squares += (x - mean) * (x - mean);
  const double se = std::sqrt(squares / double(rows - 1) / double(rows));
  if (!(se > 0)) return mean == 0 ? 0 : (mean > 0 ? INFINITY : -INFINITY);
  return mean / se;
}

// Whether every value of every vector is finite and the vectors have the same length.
bool Usable(const std::vector<double>& d, size_t rows) {
  if (d.empty() || d.size() != rows) return false;
  return std::all_of(d.begin(), d.end(), [](double x) { return std::isfinite(x); });
}

// What turns a t over `rows` rows into the t a probe of kReferenceRows rows shows of the same
// effect (scoring.h): 1 up to kReferenceRows rows.
double AtReferenceRows(size_t rows) {
  if (rows <= kReferenceRows) return 1;
  return std::sqrt(double(kReferenceRows) / double(rows));
}

}  // namespace

double MeanOf(const std::vector<double>& rows) {
  double sum = 0;
  for (double x : rows) sum += x;
  return rows.empty() ? 0 : sum / double(rows.size());
}

double Reputation::WeightOf(const Island& i) const {
  if (i.excluded_until > 0) return 0;
  const double span = options_.floor - options_.exclude_below;
  if (!(span > 0)) return i.reputation >= options_.floor ? 1 : 0;
  return std::clamp((i.reputation - options_.exclude_below) / span, 0.0, 1.0);
}

void Reputation::Update(Island& i, double score) {
  i.reputation = options_.decay * i.reputation + (1 - options_.decay) * score;
  ++i.judged;
  if (i.excluded_until == 0 && i.reputation < options_.exclude_below) {
    i.excluded_until = i.judged + options_.exclude_rounds;
  } else if (i.excluded_until > 0 && i.judged >= i.excluded_until &&
             i.reputation >= options_.floor) {
    i.excluded_until = 0;  // readmitted: back at the floor after its time out
  }
}

bool Reputation::PullsApart(Island& i, const std::vector<double>* c, size_t rows, double per_row,
                            IslandScore* s) const {
  double t = 0;
  if (c != nullptr && Usable(*c, rows)) {
    s->loo_gain = MeanOf(*c);
    s->loo_t = per_row * PairedT(*c, std::vector<double>(rows, 0.0));
    t = std::clamp(s->loo_t, -kMostPerRound, kMostPerRound);
  }
  i.loo_evidence = options_.decay * i.loo_evidence + (1 - options_.decay) * t;
  s->loo_evidence = i.loo_evidence;
  return options_.leave_one_out_t > 0 && i.loo_evidence < -options_.leave_one_out_t;
}

void Reputation::Judge(const std::map<std::string, std::vector<double>>& improvements,
                       const std::map<std::string, std::vector<double>>& combined, size_t quorum,
                       ScoreReport* report) {
  std::lock_guard<std::mutex> lock(mu_);
  // The rows' medians over the islands the probe measured (the first one's rows set the length).
  size_t rows = 0;
  for (const auto& [id, d] : improvements) rows = std::max(rows, d.size());
  std::vector<const std::vector<double>*> usable;
  std::vector<double> gains;
  for (const auto& [id, d] : improvements) {
    if (Usable(d, rows)) {
      usable.push_back(&d);
      gains.push_back(MeanOf(d));
    }
  }
  std::vector<double> median_row(rows, 0.0), column;
  for (size_t r = 0; r < rows && !usable.empty(); ++r) {
    column.clear();
    for (const auto* d : usable) column.push_back((*d)[r]);
    median_row[r] = Median(column);
  }
  const double median_gain = gains.empty() ? 0 : Median(gains);
  const double per_row = AtReferenceRows(rows);
  report->median_t = per_row * PairedT(median_row, std::vector<double>(rows, 0.0));
  // Only a round whose median contribution measurably helps can tell a useless one from it.
  const bool judges = !usable.empty() && report->median_t >= options_.significance;
  for (const auto& [id, d] : improvements) {
    Island& i = islands_[id];
    IslandScore& s = report->islands[id];
    auto c = combined.find(id);
    s.pulls_apart =
        PullsApart(i, c != combined.end() ? &c->second : nullptr, rows, per_row, &s);
    if (!Usable(d, rows)) {
      s.improvement = NAN;
      if (!usable.empty()) {
        s.score = -1;  // its probe failed where others' did not: as harmful
        Update(i, s.score);
      }
    } else {
      s.improvement = MeanOf(d);
      s.t = per_row * PairedT(d, median_row);
      if (judges) {
        const double ratio = median_gain > 0 ? s.improvement / median_gain : -1.0;
        s.score = s.t >= -options_.significance || ratio >= 0.5 ? 1.0
                                                                : std::clamp(ratio, -1.0, 1.0);
        if (s.pulls_apart) s.score = std::min(s.score, 0.0);
        s.harmful = s.score < 1 && s.t < -3 * options_.significance;
        Update(i, s.score);
      }
    }
    s.harmful = s.harmful || s.pulls_apart;
    s.reputation = i.reputation;
    s.excluded = i.excluded_until > 0 || s.harmful;
    s.weight = s.harmful ? 0 : WeightOf(i);
  }
  KeepQuorum(quorum, report);
}

// Never below the quorum: the best-reputed of the excluded stay in, at the least weight.
void Reputation::KeepQuorum(size_t quorum, ScoreReport* report) const {
  std::vector<std::pair<double, std::string>> out;
  size_t in = 0;
  for (const auto& [id, s] : report->islands) {
    if (s.excluded) {
      out.emplace_back(s.reputation, id);
    } else {
      ++in;
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (size_t k = 0; in < quorum && k < out.size(); ++k, ++in) {
    IslandScore& s = report->islands[out[k].second];
    s.excluded = false;
    s.weight = kQuorumWeight;
  }
}

IslandScore Reputation::Standing(const std::string& island) const {
  std::lock_guard<std::mutex> lock(mu_);
  IslandScore s;
  auto it = islands_.find(island);
  if (it == islands_.end()) return s;
  s.reputation = it->second.reputation;
  s.excluded = it->second.excluded_until > 0;
  s.weight = WeightOf(it->second);
  return s;
}

std::vector<SavedStanding> Reputation::Save() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SavedStanding> saved;
  for (const auto& [id, i] : islands_) {
    saved.push_back({id, i.reputation, i.judged, i.excluded_until, i.loo_evidence});
  }
  return saved;
}

absl::Status Reputation::Restore(const std::vector<SavedStanding>& saved) {
  if (saved.size() > kMaxSaved) {
    return absl::DataLossError(absl::StrCat("service state: ", saved.size(),
                                            " islands' standings, at most ", kMaxSaved));
  }
  std::map<std::string, Island> islands;
  for (const SavedStanding& s : saved) {
    auto refuse = [&](const std::string& what) {
      return absl::DataLossError(
          absl::StrCat("service state: the standing of island '", absl::CHexEscape(s.island),
                       "' ", what));
    };
    if (s.island.empty() || s.island.size() > 256) return refuse("has no usable name");
    if (!(std::isfinite(s.reputation) && std::abs(s.reputation) <= 1)) {
      return refuse(absl::StrCat("has reputation ", s.reputation, ", outside [-1, 1]"));
    }
    if (!(std::isfinite(s.loo_evidence) && std::abs(s.loo_evidence) <= kMostPerRound)) {
      return refuse(absl::StrCat("has leave-one-out evidence ", s.loo_evidence,
                                 ", outside [-8, 8]"));
    }
    Island i{s.reputation, s.judged, s.excluded_until, s.loo_evidence};
    if (!islands.emplace(s.island, i).second) return refuse("is given twice");
  }
  std::lock_guard<std::mutex> lock(mu_);
  islands_ = std::move(islands);
  return absl::OkStatus();
}

}  // namespace atl::outer
