// outer.scoring = "loss_probe": each on-time contribution of a sync round probed on the held-out
// batch with it alone applied, and the round's average with and without each island (leave-one-
// out); the islands judged against the round's median and by that evidence (outer/base/scoring.h)
// and weighed by their standing before the fold. Every copy applies the one update (or recipe)
// the service makes from these weights, so they stay bit-identical whatever the probe measured.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "outer/base/copies.h"
#include "outer/service/rounds.h"

namespace atl::outer {

namespace {

struct Probed {  // an on-time contribution the probe measured alone
  std::string island;
  double tokens = 0;
  const EncodedPayload* payload = nullptr;
};

// The round's token-weighted average of the probed contributions, and that average without each
// one in turn (leave-one-out): per island, what the combination loses on each row without it
// (loss(global - average without it) - loss(global - average)). A contribution can help alone and
// still pull the average away from where the others agree (an island trained on garbage).
std::map<std::string, std::vector<double>> ProbeCombination(uint32_t fragment,
                                                            const float* global, uint64_t n,
                                                            const std::vector<Probed>& probed,
                                                            const std::vector<double>& total,
                                                            double tokens, LossProbe& probe) {
  std::map<std::string, std::vector<double>> combined;
  std::vector<float> trial(n);
  for (uint64_t i = 0; i < n; ++i) trial[i] = float(double(global[i]) - total[i] / tokens);
  auto all = probe.Losses(fragment, trial.data(), n);
  if (!all.ok()) return combined;
  for (const Probed& e : probed) {
    if (!e.payload->Read(0, n, trial.data()).ok()) continue;
    const double w = e.tokens;
    if (!(tokens - w > 0)) continue;
    for (uint64_t i = 0; i < n; ++i) {
      trial[i] = float(double(global[i]) - (total[i] - w * trial[i]) / (tokens - w));
    }
    auto without = probe.Losses(fragment, trial.data(), n);
    if (!without.ok() || without->size() != all->size()) continue;
    std::vector<double>& c = combined[e.island];
    c.resize(all->size());
    for (size_t r = 0; r < c.size(); ++r) c[r] = (*without)[r] - (*all)[r];
  }
  return combined;
}

// The log line of an island left out of a round.
std::string LeftOut(uint64_t round, uint32_t fragment, const std::string& island,
                    const IslandScore& s, const ScoringOptions& options) {
  const std::string head =
      absl::StrFormat("round %d of fragment %d: island '%s' left out", round, fragment, island);
  if (!s.harmful) {
    return absl::StrFormat("%s (reputation %.3f, below %.3g)", head, s.reputation,
                           options.exclude_below);
  }
  if (s.pulls_apart) {
    return absl::StrFormat("%s: the round's average does better without it (leave-one-out "
                           "evidence %.2f, t %.1f; reputation %.3f)",
                           head, s.loo_evidence, s.loo_t, s.reputation);
  }
  return absl::StrFormat("%s: its contribution harms the held-out loss (t %.1f against the "
                         "median; reputation %.3f)",
                         head, s.t, s.reputation);
}

}  // namespace

// The round's average as the fold would weigh it: the on-time contributions of the islands not
// excluded by their reputation, copies weighing as one.
std::map<std::string, double> Rounds::AverageWeights(const CommitJob& job, uint64_t n,
                                                     const std::vector<CommitEntry>& entries) const {
  std::vector<ContributionRef> refs;
  for (const auto& e : entries) {
    if (!e.late && !core_.reputation.Standing(e.ref.island).excluded) refs.push_back(e.ref);
  }
  CopyReport copies;
  WeighCopies(core_.options.aggregation.copies, refs, n, CopySeed(job), &copies);
  std::map<std::string, double> weights;
  for (const auto& r : refs) weights[r.island] = double(r.tokens);
  return weights;
}

// A commit that takes the islands somewhere worse than where they agree: the outer step (Nesterov:
// lr (g + mu m'), here 1.33 g plus what the momentum carries) is an extrapolation past the plain
// average of the islands' trained parameters (global - g), and on micro its probed loss stays
// within 1.7% of the average's in clean runs. After an island trained on shuffled tokens is left
// out, the honest islands' first round undoes what it taught the global parameters: a large g
// along a sharp valley, where the step overshot to 5.26 against the average's 3.35 and the run
// never made up the lag (outer/README.md). The round commits the average itself (a warm-start
// step: u = g) and the outer momentum restarts from zero, so that what it carried across the
// undone rounds is not applied again, when the step's probed loss is more than `step_guard` (a
// fraction) above the average's, or when the scoring leaves out an island the last commit folded
// in: the momentum carries that island's contributions, which the service now finds harmful, and
// whether the probe's rows show the overshoot is chance (seed 5 on micro: 35% above with the
// split's last windows, below the average with rows spread over the split). Sync dense steps of
// a non-linear optimizer.
bool Rounds::GuardsTheStep(ServiceFragment& f, const CommitJob& job, const float* g,
                           const std::vector<std::string>& purged, ScoreReport* scores,
                           std::vector<std::string>& events) {
  LossProbe* probe = core_.options.loss_probe.get();
  const double guard = core_.options.scoring.step_guard;
  if (!core_.options.scoring.loss_probe || probe == nullptr || !(guard > 0) ||
      core_.options.async || f.data.optimizer().linear()) {
    return false;
  }
  const uint64_t n = f.data.size();
  const float* global = f.data.params().data();
  std::vector<float> trial(n);
  auto mean_loss = [&]() -> double {
    auto losses = probe->Losses(job.fragment, trial.data(), n);
    return losses.ok() ? MeanOf(*losses) : 0;
  };
  for (uint64_t i = 0; i < n; ++i) trial[i] = global[i] - g[i];
  scores->average_loss = mean_loss();
  f.data.optimizer().Preview(g, trial.data(), 0, n);
  for (uint64_t i = 0; i < n; ++i) trial[i] = global[i] - trial[i];
  scores->step_loss = mean_loss();
  const bool overshoots =
      scores->average_loss > 0 && scores->step_loss > scores->average_loss * (1 + guard);
  if (!overshoots && purged.empty()) return false;
  scores->step_guarded = true;
  const std::string head = absl::StrFormat("round %d of fragment %d: ", job.round, job.fragment);
  if (overshoots) {
    events.push_back(absl::StrFormat(
        "%sthe outer step would leave the held-out loss at %.4f, %.0f%% above the %.4f of the "
        "islands' plain average; the round commits that average and restarts the outer momentum",
        head, scores->step_loss, 100 * (scores->step_loss / scores->average_loss - 1),
        scores->average_loss));
  } else {
    events.push_back(absl::StrCat(head, "left out '", absl::StrJoin(purged, "', '"),
                                  "', which the last commit folded in and the outer momentum "
                                  "carries; the round commits the islands' plain average and "
                                  "restarts the outer momentum"));
  }
  f.data.set_averaging(true);
  f.data.set_lr(1.0);
  return true;
}

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
  std::map<std::string, std::vector<double>> gains, combined;
  size_t on_time = 0;
  if (base.ok()) {
    report.loss = MeanOf(*base);
    std::vector<float> delta(n), trial(n);
    std::vector<double> total(n, 0.0);  // sum of tokens x delta over the probed contributions
    double tokens = 0;
    std::vector<Probed> probed;
    const std::map<std::string, double> in_average = AverageWeights(job, n, entries);
    for (const auto& e : entries) {
      if (e.late) continue;
      ++on_time;
      if (!e.payload->Read(0, n, delta.data()).ok()) continue;  // the fold refuses it
      for (uint64_t i = 0; i < n; ++i) trial[i] = global[i] - delta[i];
      auto losses = probe->Losses(job.fragment, trial.data(), n);
      std::vector<double>& d = gains[e.ref.island];  // empty: the probe failed for it
      if (!losses.ok() || losses->size() != base->size()) continue;
      d.resize(base->size());
      for (size_t r = 0; r < d.size(); ++r) d[r] = (*base)[r] - (*losses)[r];
      auto in = in_average.find(e.ref.island);
      if (in == in_average.end()) continue;
      const double w = in->second;
      for (uint64_t i = 0; i < n; ++i) total[i] += w * delta[i];
      tokens += w;
      probed.push_back({e.ref.island, w, e.payload.get()});
    }
    if (core_.options.scoring.leave_one_out_t > 0 && probed.size() >= 3) {
      combined = ProbeCombination(job.fragment, global, n, probed, total, tokens, *probe);
    }
    // The probe's model is set to the committed parameters after the step (Rounds::RunCommit).
  }
  const size_t quorum = std::min(on_time, size_t(std::max(1, core_.options.min_islands)));
  core_.reputation.Judge(gains, combined, quorum, &report);
  // Late contributions keep their island's standing; every contribution's weight scales its tokens.
  for (auto it = entries.begin(); it != entries.end();) {
    auto scored = report.islands.find(it->ref.island);
    const IslandScore s = scored != report.islands.end() ? scored->second
                                                         : core_.reputation.Standing(it->ref.island);
    if (scored == report.islands.end() && (s.excluded || s.weight < 1)) {
      report.islands[it->ref.island] = s;
    }
    if (s.excluded) {  // (a harmful one kept for the quorum is not)
      events.push_back(LeftOut(job.round, job.fragment, it->ref.island, s,
                                core_.options.scoring));
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
