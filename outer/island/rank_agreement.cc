// The ranks of a multi-rank island agreeing (outer/island/outer_step.h): on the round each fragment
// goes on from after their fetches, and on the service's answers to a round's push.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "compression/status_macros.h"
#include "outer/island/outer_step.h"

namespace atl::outer {

// Each rank fetches its ranges for itself, so a round can commit between the ranks' fetches (the
// round the island joined in, which does not wait for it; async, any other island's version).
// Ranks at different rounds push to different rounds: the island's contribution to either is never
// whole, and the rank whose part was taken waits for an update that only the round's deadline
// brings, its peers for it. Every rank goes on from the newest round any of them fetched: the
// others apply the updates committed in between (all committed: a rank fetched the state after
// them), or, where those are no longer kept, fetch the state again and the ranks compare anew.
absl::Status OuterStepHook::AgreeOnRound(uint32_t f) {
  if (ranks_.size() == 1) return absl::OkStatus();
  IslandSync& sync = *syncs_[f];
  for (int attempt = 0;; ++attempt) {
    // From the first rank that carries the fragment (one that carries nothing has not fetched).
    ATL_ASSIGN_OR_RETURN(auto first,
                         ranks_.FromFirstWhere(sync.carried(), std::to_string(sync.round())));
    uint64_t newest = 0;
    if (!absl::SimpleAtoi(first, &newest)) {
      return absl::DataLossError("the first carrying rank's round is garbled");
    }
    // Rounds only move forward, seldom by more than one between the ranks' fetches. A rank that
    // carries nothing of the fragment takes the others' round.
    while (true) {
      ATL_ASSIGN_OR_RETURN(auto ahead, ranks_.Any(sync.carried() && sync.round() > newest));
      if (!ahead) break;
      ++newest;
    }
    if (sync.round() < newest || !sync.carried()) {
      auto caught = Retry(options_.island.retry, [&] { return sync.CatchUp(newest); });
      if (!caught.ok()) return caught.status();
      stats_.bytes_received += caught->bytes_received;
    }
    ATL_ASSIGN_OR_RETURN(auto apart, ranks_.Any(sync.round() != newest));
    if (!apart) return absl::OkStatus();
    if (attempt >= options_.island.sync.retries) {
      return absl::AbortedError(absl::StrCat("the island's ranks hold different rounds of fragment ",
                                             f, ": the global state kept changing"));
    }
  }
}

// The service's answers that change what the island does next (tau; the island's H, the run's
// progress and its end; a late push's lag, in the first rank's steps) and the round's
// contributors are those of the first rank that
// carries the fragment (rank 0, unless it is a pipeline stage holding none of it): every rank
// takes them, whatever its own push got (a rank that carries nothing of the fragment got none).
// Every rank lands the same fragments in the same order, so every rank calls this as often.
absl::Status OuterStepHook::FollowFirstCarrier(uint32_t f, absl::StatusOr<RoundOutcome>& outcome,
                                               int64_t& behind_steps) {
  behind_steps = 0;
  if (outcome.ok() && outcome->late && std::isfinite(outcome->behind_s * steps_per_s_)) {
    behind_steps = std::llround(std::clamp(outcome->behind_s * steps_per_s_, 0.0, 1e12));
  }
  if (ranks_.size() == 1) return absl::OkStatus();
  std::string mine = "!";
  if (outcome.ok()) {
    mine = absl::StrCat(outcome->tau, " ", outcome->sync_every, " ", outcome->tokens_committed,
                        " ", outcome->budget_reached ? 1 : 0, " ", outcome->contributors, " ",
                        behind_steps);
  }
  ATL_ASSIGN_OR_RETURN(auto first, ranks_.FromFirstWhere(syncs_[f]->carried(), mine));
  if (!outcome.ok()) return absl::OkStatus();
  RoundOutcome& o = *outcome;
  o.tau = -1;
  o.sync_every = 0;
  o.tokens_committed = 0;
  o.budget_reached = false;
  behind_steps = 0;
  if (first == "!") return absl::OkStatus();  // its push failed: the island rejoins
  const std::vector<std::string> parts = absl::StrSplit(first, ' ');
  int budget = 0;
  if (parts.size() != 6 || !absl::SimpleAtoi(parts[0], &o.tau) ||
      !absl::SimpleAtoi(parts[1], &o.sync_every) ||
      !absl::SimpleAtoi(parts[2], &o.tokens_committed) || !absl::SimpleAtoi(parts[3], &budget) ||
      !absl::SimpleAtoi(parts[4], &o.contributors) ||
      !absl::SimpleAtoi(parts[5], &behind_steps)) {
    return absl::DataLossError("the first carrying rank's answer of the service is garbled");
  }
  o.budget_reached = budget != 0;
  return absl::OkStatus();
}

}  // namespace atl::outer
