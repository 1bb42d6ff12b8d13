#include "outer/island/moment_sync.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "outer/base/moment_values.h"
#include "outer/island/outer_step.h"

namespace atl::outer {

MomentPush MomentsToPush(IslandModel& model, const IslandSync& sync, uint32_t every,
                         bool averaging) {
  MomentPush m;
  const uint64_t round = sync.round();
  if (every == 0 || averaging || !sync.carried() || (round + 1) % every != 0) return m;
  m.optimizer = model.moment_optimizer();
  if (m.optimizer.empty()) return m;
  m.values = model.MomentSnapshot(sync.fragment());
  m.round = round;
  return m;
}

absl::StatusOr<RoundOutcome> WithMoments(
    IslandSync& sync, const MomentPush& moments, uint64_t step,
    const std::function<absl::StatusOr<RoundOutcome>()>& round) {
  if (moments.optimizer.empty()) return round();
  // Before the pseudo-gradient: the round cannot commit without them, so once it has, the
  // service holds every on-time island's.
  auto sent = sync.PushMoments(moments.optimizer, moments.values, moments.round, step);
  auto outcome = round();
  if (!outcome.ok()) return outcome;
  if (!sent.ok()) {
    outcome->moment_note = absl::StrCat("its moments were not taken (", sent.status().message(),
                                        "); it keeps its own");
    return outcome;
  }
  outcome->bytes_sent += *sent;
  if (outcome->late || outcome->round != moments.round) {
    outcome->moment_note = "its push was late for the moments' round; it keeps its own";
    return outcome;
  }
  uint64_t bytes = 0;
  auto average = sync.FetchMoments(moments.optimizer, moments.round, &bytes);
  outcome->bytes_received += bytes;
  if (!average.ok()) {
    outcome->moment_note = absl::StrCat("the averaged moments were not fetched (",
                                        average.status().message(), "); it keeps its own");
    return outcome;
  }
  outcome->moments = *std::move(average);
  return outcome;
}

namespace {

// Why `average` is implausible against the island's `own` moments ("" when it is not).
std::string Implausible(const std::vector<float>& average, const std::vector<float>& own) {
  if (own.size() != average.size()) return "it does not fit this rank's ranges";
  const size_t n = own.size() / kMomentChannels;
  // The bounds every moment the service takes meets (a joiner's only check: TakeNewestMoments).
  if (std::string problem = MomentValuesProblem(average.data(), 0, average.size(), n);
      !problem.empty()) {
    return problem;
  }
  for (uint32_t c = 0; c < kMomentChannels; ++c) {
    double mine = 0, theirs = 0;
    for (size_t i = c * n; i < (c + 1) * n; ++i) {
      mine += double(own[i]) * own[i];
      theirs += double(average[i]) * average[i];
    }
    if (mine > 0 && !(theirs <= kMomentBound * kMomentBound * mine)) {
      return absl::StrCat("its channel ", c, " norm is ", std::sqrt(theirs / mine),
                          " times this island's (at most ", kMomentBound, ")");
    }
  }
  return "";
}

}  // namespace

bool LoadLandedMoments(IslandModel& model, uint32_t fragment, const RoundOutcome& outcome,
                       const std::function<void(const std::string&)>& say) {
  std::string note = outcome.moment_note;
  if (!outcome.moments.empty()) {
    const std::string implausible = Implausible(outcome.moments, model.MomentSnapshot(fragment));
    if (implausible.empty()) {
      model.LoadMoments(fragment, outcome.moments);
      return true;
    }
    note = absl::StrCat("the averaged moments were not loaded (", implausible,
                        "); it keeps its own");
  }
  if (!note.empty() && say) {
    say(absl::StrCat("fragment ", fragment, " round ", outcome.round, ": ", note));
  }
  return false;
}

int TakeNewestMoments(IslandModel& model, const std::vector<IslandSync*>& syncs, uint32_t every,
                      const std::function<void(const std::string&)>& say) {
  const std::string optimizer = model.moment_optimizer();
  if (every == 0 || optimizer.empty() || !model.MomentsFresh()) return 0;
  int taken = 0;
  for (IslandSync* sync : syncs) {
    if (!sync->carried()) continue;
    auto average = sync->FetchMoments(optimizer, 0, nullptr);
    if (absl::IsNotFound(average.status())) continue;
    // A joiner has no moments of its own to hold the average against: it checks the bounds every
    // moment the service takes must meet.
    std::string problem;
    if (average.ok()) {
      const uint64_t n = average->size() / kMomentChannels;
      problem = MomentValuesProblem(average->data(), 0, average->size(), n);
    }
    if (!average.ok() || !problem.empty()) {
      if (say) {
        say(absl::StrCat("fragment ", sync->fragment(), ": the run's moments were not ",
                         average.ok() ? "loaded (" : "fetched (",
                         average.ok() ? problem : std::string(average.status().message()),
                         "); it starts from zeros"));
      }
      continue;
    }
    model.LoadMoments(sync->fragment(), *average);
    ++taken;
  }
  return taken;
}

}  // namespace atl::outer
