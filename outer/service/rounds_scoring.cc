// outer.scoring = "loss_probe": each on-time contribution of a sync round probed on the held-out
// batch with it alone applied, the islands judged against the round's median (outer/base/scoring.h)
// and weighed by their standing before the fold. Every copy applies the one update (or recipe)
// the service makes from these weights, so they stay bit-identical whatever the probe measured.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "outer/service/rounds.h"

namespace atl::outer {

ScoreReport Rounds::ScoreEntries(const ServiceFragment& f, const CommitJob& job,
                                 std::vector<CommitEntry>& entries, Dropped& dropped,
                                 std::vector<std::string>& events) {
  ScoreReport report;
  LossProbe* probe = core_.options.loss_probe.get();
  if (!core_.options.scoring.loss_probe || probe == nullptr || entries.empty()) return report;
  const absl::Time started = absl::Now();
  const uint64_t n = f.data.size();
  const float* global = f.data.params().data();
  auto base = probe->Losses(job.fragment, global, n);
  if (!base.ok()) {
    events.push_back(absl::StrCat("round ", job.round, " of fragment ", job.fragment,
                                  ": the loss probe failed (", base.status().message(),
                                  "); weights as they stood"));
  }
  // Each on-time contribution alone: the island's own trained fragment, global - delta; what it
  // buys on each row of the batch.
  std::map<std::string, std::vector<double>> gains;
  size_t on_time = 0;
  if (base.ok()) {
    double sum = 0;
    for (double x : *base) sum += x;
    report.loss = base->empty() ? 0 : sum / double(base->size());
    std::vector<float> trial(n);
    for (const auto& e : entries) {
      if (e.late) continue;
      ++on_time;
      if (!e.payload->Read(0, n, trial.data()).ok()) continue;  // the fold refuses it
      for (uint64_t i = 0; i < n; ++i) trial[i] = global[i] - trial[i];
      auto losses = probe->Losses(job.fragment, trial.data(), n);
      std::vector<double>& d = gains[e.ref.island];  // empty: the probe failed for it
      if (!losses.ok() || losses->size() != base->size()) continue;
      d.resize(base->size());
      for (size_t r = 0; r < d.size(); ++r) d[r] = (*base)[r] - (*losses)[r];
    }
    // The probe's model is set to the committed parameters after the step (Rounds::RunCommit).
  }
  const size_t quorum = std::min(on_time, size_t(std::max(1, core_.options.min_islands)));
  reputation_.Judge(gains, quorum, &report);
  // Late contributions keep their island's standing; every contribution's weight scales its tokens.
  for (auto it = entries.begin(); it != entries.end();) {
    auto scored = report.islands.find(it->ref.island);
    const IslandScore s = scored != report.islands.end() ? scored->second
                                                         : reputation_.Standing(it->ref.island);
    if (scored == report.islands.end() && (s.excluded || s.weight < 1)) {
      report.islands[it->ref.island] = s;
    }
    if (s.excluded) {  // (a harmful one kept for the quorum is not)
      events.push_back(
          s.harmful
              ? absl::StrFormat("round %d of fragment %d: island '%s' left out: its contribution "
                                "harms the held-out loss (t %.1f against the median; reputation "
                                "%.3f)",
                                job.round, job.fragment, it->ref.island, s.t, s.reputation)
              : absl::StrFormat("round %d of fragment %d: island '%s' left out (reputation %.3f, "
                                "below %.3g)",
                                job.round, job.fragment, it->ref.island, s.reputation,
                                core_.options.scoring.exclude_below));
      dropped.emplace_back(it->ref.island, it->tokens);
      it = entries.erase(it);
      continue;
    }
    if (s.weight < 1) {  // (and > 0)
      const double weighed = std::round(double(it->ref.tokens) * s.weight);
      it->ref.tokens = std::max<uint64_t>(1, uint64_t(weighed));
    }
    ++it;
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - started);
  return report;
}

}  // namespace atl::outer
