// The service's account of what a contribution may claim and of what it did claim: the bound on
// its tokens and step, its weight in the round, the steps and rounds each island has contributed
// (a push again is never folded twice), the claims flagged against an island's throughput, and
// what the ledger takes of a refused push.
#include <algorithm>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "outer/service/rounds.h"

namespace atl::outer {

// A refused contribution's tokens go to the ledger: once per contribution (the push of its first
// element, of fragment 0), not for a transient refusal the island retries, nor for a caller that
// could not show the island's session.
void Rounds::NoteRefused(const PayloadId& id, uint64_t first_offset, uint64_t tokens,
                         const absl::Status& why) {
  if (id.fragment != 0 || first_offset != 0 || tokens == 0) return;
  const std::string reason = RefusalReason(why);
  // (AlreadyExists: the service has the contribution; a push again after its answer was lost.
  // Invalid: its claim, values or shape were not accepted, so neither is its word on its tokens;
  // what it trained shows as lost.)
  if (reason == "unavailable" || reason == "invalid" || absl::IsUnauthenticated(why) ||
      absl::IsNotFound(why) || absl::IsAlreadyExists(why)) {
    return;
  }
  std::lock_guard<std::mutex> lock(core_.mu);
  if (core_.membership.Find(id.island_id) == nullptr && !absl::IsPermissionDenied(why) &&
      !absl::IsFailedPrecondition(why)) {
    return;
  }
  // A claim is the caller's word: the ledger takes at most what the round could have carried.
  if (core_.options.tokens_per_step > 0 && !core_.options.async && id.fragment < core_.fragments.size()) {
    tokens = std::min(tokens, TokensBoundLocked(id, ClaimStepsLocked(id)));
  }
  core_.ledger.Refused(id.island_id, id.round, reason, tokens);
}

uint64_t Rounds::ClaimStepsLocked(const PayloadId& id) const {
  const Member* m = core_.membership.Find(id.island_id);
  // Sync: the round's own steps (one in a warm-start round), a late contribution's too; an
  // island's first contribution after it joined reaches back to the step it resumed at, one
  // carrying a refused push's steps to the round after its last recorded one.
  // Async: the run's H. An island's own H (dynamic local steps) is at most that, and a fragment's
  // next push follows the H the island held at its last one, which may be any it was told.
  if (core_.options.async) return core_.options.sync_every;
  const SyncSchedule schedule = core_.Schedule();
  const int f = int(id.fragment);
  int64_t start = schedule.RoundStart(f, id.round);
  const bool first =
      m == nullptr || id.fragment >= m->contributed.size() || !m->contributed[id.fragment];
  if (first) start = std::min(start, std::max<int64_t>(0, m ? m->resume_floor : 0));
  if (auto d = done_.find(id.island_id); d != done_.end() && id.fragment < d->second.size() &&
                                         d->second[id.fragment].rounds > 0) {
    start = std::min(start, schedule.RoundStart(f, d->second[id.fragment].rounds));
  }
  return uint64_t(std::max<int64_t>(0, schedule.DueStep(f, id.round) - start));
}

uint64_t Rounds::TokensBoundLocked(const PayloadId& id, uint64_t steps) const {
  const Member* m = core_.membership.Find(id.island_id);
  const uint64_t ranks = m != nullptr ? m->data_parallel : 1;
  const absl::uint128 bound = absl::uint128(steps) * core_.options.tokens_per_step * ranks;
  return bound > UINT64_MAX ? UINT64_MAX : absl::Uint128Low64(bound);
}

absl::Status Rounds::CheckClaimLocked(const PayloadId& id, uint64_t tokens) const {
  if (core_.options.tokens_per_step == 0) return absl::OkStatus();
  const uint64_t steps = ClaimStepsLocked(id);
  const uint64_t bound = TokensBoundLocked(id, steps);
  if (tokens <= bound) return absl::OkStatus();
  const Member* m = core_.membership.Find(id.island_id);
  return absl::InvalidArgumentError(absl::StrCat(
      "contribution of island '", id.island_id, "' to round ", id.round, " of fragment ",
      id.fragment, " claims ", tokens, " tokens; it covers at most ", steps, " inner steps of ",
      core_.options.tokens_per_step, " tokens on each of the island's ",
      m != nullptr ? m->data_parallel : 1, " data-parallel ranks: ", bound));
}

absl::Status Rounds::CheckStepLocked(const PayloadId& id, uint64_t step) const {
  // A sync run that ends at its steps: no island trains past its last one (an island that was
  // away trains the steps it owes up to it, no further).
  const uint64_t last = core_.options.total_inner_steps;
  if (core_.options.async || core_.options.token_budget > 0 || last == 0 || step <= last) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("contribution of island '", id.island_id,
                                                 "' to round ", id.round, " of fragment ",
                                                 id.fragment, " says it was pushed at inner step ",
                                                 step, ", past the run's last step ", last));
}

uint64_t Rounds::WeightLocked(const PayloadId& id, uint64_t tokens) {
  if (core_.options.tokens_per_step == 0 || core_.options.async) return tokens;
  const uint64_t steps = uint64_t(std::max<int64_t>(1, RoundStepsLocked(id.fragment, id.round)));
  const uint64_t round = TokensBoundLocked(id, steps);
  if (tokens <= round) return tokens;
  // Work from before the round (an island back from a failure with the steps it trained away,
  // a refused push carried over) is in the pseudo-gradient already: a larger weight would count it
  // twice, and take the round from the islands that trained it.
  if (Member* m = core_.membership.FindMutable(id.island_id); m != nullptr) ++m->flagged_claims;
  core_.EventLocked(
      absl::StrCat("island '", id.island_id, "' claims more than a round's tokens"),
      absl::StrFormat(": %d tokens for round %d of fragment %d, %.1f rounds of work; it weighs "
                      "as one round (%d tokens)",
                      tokens, id.round, id.fragment, double(tokens) / double(round), round));
  return round;
}

uint64_t Rounds::DoneStepLocked(const std::string& island, uint32_t fragment) const {
  auto it = done_.find(island);
  return it != done_.end() && fragment < it->second.size() ? it->second[fragment].step : 0;
}

absl::Status Rounds::CheckNotRecordedLocked(const PayloadId& id) const {
  auto it = done_.find(id.island_id);
  if (it == done_.end() || id.fragment >= it->second.size() ||
      id.round >= it->second[id.fragment].rounds) {
    return absl::OkStatus();
  }
  return absl::AlreadyExistsError(absl::StrCat("island '", id.island_id,
                                               "' has already contributed to round ", id.round,
                                               " of fragment ", id.fragment));
}

void Rounds::NoteContributedLocked(const PayloadId& id, uint64_t tokens, uint64_t step) {
  if (id.fragment == 0) core_.ledger.Pushed(id.island_id, id.round, tokens);
  if (done_.count(id.island_id) || done_.size() < kMaxDoneIslands) {
    auto& done = done_[id.island_id];
    if (done.size() < core_.fragments.size()) done.resize(core_.fragments.size());
    done[id.fragment].step = std::max(done[id.fragment].step, step);
    done[id.fragment].rounds = std::max(done[id.fragment].rounds, id.round + 1);
  }
  Member* m = core_.membership.FindMutable(id.island_id);
  if (m == nullptr) return;
  if (m->contributed.size() < core_.fragments.size()) m->contributed.resize(core_.fragments.size());
  if (!m->contributed[id.fragment]) m->tokens_first += tokens;
  if (!m->first_contribution_at) m->first_contribution_at = absl::Now();
  m->contributed[id.fragment] = true;
  m->tokens_claimed += tokens;
  FlagClaimLocked(*m, absl::Now());
}

void Rounds::FlagClaimLocked(Member& m, absl::Time now) {
  if (m.peak_tokens_per_s <= 0) return;  // no throughput reported yet (or a shard: none heard)
  // Each fragment's contributions count the island's training once.
  uint32_t owned = 0;
  for (uint32_t f = 0; f < core_.fragments.size(); ++f)
    owned += ShardOwns(core_.options, f) ? 1 : 0;
  const double trained = double(m.tokens_claimed - m.tokens_first) / std::max<uint32_t>(1, owned);
  if (trained <= 0 || !m.first_contribution_at) return;
  const double elapsed_s = absl::ToDoubleSeconds(now - *m.first_contribution_at);
  if (elapsed_s < kClaimMinWindowS) return;
  const double possible = m.peak_tokens_per_s * elapsed_s;
  if (trained <= kClaimFlagFactor * possible) return;
  ++m.flagged_claims;
  core_.EventLocked(
      absl::StrCat("island '", m.name, "' claims more tokens than its throughput allows"),
      absl::StrFormat(": %.0f tokens in %.1f s since its first contribution, %.1fx what %.0f tokens/s (the most "
                      "its heartbeats reported) train; its declared data-parallel ranks (%u) may "
                      "be false",
                      trained, elapsed_s, possible > 0 ? trained / possible : 0.0,
                      m.peak_tokens_per_s, m.data_parallel));
}

}  // namespace atl::outer
