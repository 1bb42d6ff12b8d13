// The service side of a push: a stream checked message by message, a contribution recorded
// (sync) or applied (async) once verified (what it may claim: rounds_claims.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "outer/base/names.h"
#include "outer/service/rounds.h"

namespace atl::outer {

PushStream::PushStream(Rounds* rounds, ChunkStream chunks, uint64_t first_offset,
                       std::string session, uint64_t tokens, uint64_t step,
                       IslandFigures figures, KeptBudget* kept_budget)
    : rounds_(rounds), chunks_(std::move(chunks)), first_offset_(first_offset),
      session_(std::move(session)), tokens_(tokens), step_(step), figures_(figures) {
  if (chunks_.payload().codec.sparse()) meter_.emplace(kept_budget);
}

PushStream::~PushStream() {
  if (moments_.empty()) rounds_->ClosePush(chunks_.id(), first_offset_);
}

absl::Status PushStream::Add(pb::PushRequest&& request) {
  ATL_RETURN_IF_ERROR(chunks_.Add(std::move(*request.mutable_chunk())));
  // A failure is the meter's to report when the push finishes (as a dense one's is).
  if (meter_) meter_->Add(chunks_.payload().codec, chunks_.newest()).IgnoreError();
  // Data arriving from the island shows it alive, though its heartbeats may queue behind it.
  rounds_->Renew(chunks_.id().island_id);
  return absl::OkStatus();
}

void Rounds::Renew(const std::string& island) {
  std::lock_guard<std::mutex> lock(core_.mu);
  core_.membership.Heartbeat(island, absl::Now()).IgnoreError();
}

void Rounds::ForgetLocked(const std::string& island) {
  steps_per_s_.erase(island);
  if (tuner_) tuner_->Forget(island);
  for (auto& f : core_.fragments) {
    f.partials.erase(island);
    f.applied.erase(island);
  }
}

absl::Status Rounds::CheckPushLocked(const PayloadId& id) const {
  const ServiceFragment& frag = core_.fragments[id.fragment];
  if (core_.options.async) return CheckAsyncLocked(frag, id.fragment, id.island_id, id.round);
  ATL_RETURN_IF_ERROR(core_.membership.CheckMember(id.island_id));
  ATL_RETURN_IF_ERROR(CheckNotRecordedLocked(id));
  if (id.round > frag.round) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", id.round, " of fragment ", id.fragment, " is unknown; the current round is ",
                     frag.round, ": fetch the global state and continue"));
  }
  if (id.round < OpenRoundLocked(frag)) return CheckLateLocked(frag, id);
  if (frag.contributions.count(id.island_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("island '", id.island_id, "' has already contributed to round ", id.round));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PushStream>> Rounds::OpenPush(const pb::PushRequest& first) {
  auto stream = OpenPushChecked(first);
  if (!stream.ok()) {
    const auto& h = first.chunk().header();
    NoteRefused({h.run_id(), h.island_id(), h.round(), h.fragment()}, h.offset(), first.tokens(),
                stream.status());
  }
  return stream;
}

absl::StatusOr<pb::PushResponse> Rounds::FinishPush(std::unique_ptr<PushStream> stream) {
  const PayloadId id = stream->chunks_.id();
  const uint64_t offset = stream->first_offset_, tokens = stream->tokens_;
  auto response = FinishPushChecked(std::move(stream));
  if (!response.ok()) NoteRefused(id, offset, tokens, response.status());
  return response;
}

absl::StatusOr<std::unique_ptr<PushStream>> Rounds::OpenPushChecked(const pb::PushRequest& first) {
  const auto& h = first.chunk().header();
  ATL_RETURN_IF_ERROR(core_.CheckRun(h.run_id()));
  ATL_ASSIGN_OR_RETURN(auto fid, core_.CheckFragment(h.fragment()));
  const PayloadId id{core_.options.run_id, h.island_id(), h.round(), fid};
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    ATL_RETURN_IF_ERROR(core_.membership.Authenticate(id.island_id, first.session()));
    ATL_RETURN_IF_ERROR(CheckPushLocked(id));
    ATL_RETURN_IF_ERROR(CheckStepLocked(id, first.step()));
    // One push at a time per island, fragment and first element (a rank retrying its push while
    // the first attempt is still being read is told to wait).
    if (!open_pushes_.emplace(id.island_id, id.fragment, h.offset()).second) {
      return absl::UnavailableError(absl::StrCat("a push of island '", id.island_id,
                                                 "' for fragment ", id.fragment, " from element ",
                                                 h.offset(),
                                                 " is already under way; retry when "
                                                 "it has ended"));
    }
  }
  const FragmentLayout& layout = core_.fragments[fid].layout;
  // A rank owns a range per unit (block) of the fragment it shards, and its tensor-parallel part of
  // a parameter is at most three ranges: at most four per parameter. The cap bounds what a peer
  // can make the stream keep per range (one scale block each).
  const size_t max_ranges = std::max<size_t>(64, 4 * layout.names.size());
  return std::unique_ptr<PushStream>(new PushStream(
      this, ChunkStream(id, core_.options.codec, layout.total(), max_ranges), h.offset(),
      first.session(), first.tokens(), first.step(),
      IslandFigures{first.inner_steps_per_s(), first.link_bps()},
      MayFoldSparsely() ? &kept_budget_ : nullptr));
}

void Rounds::ClosePush(const PayloadId& id, uint64_t first_offset) {
  std::lock_guard<std::mutex> lock(core_.mu);
  open_pushes_.erase({id.island_id, id.fragment, first_offset});
}

void Rounds::RememberRangesLocked(ServiceFragment& f,
                                  const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  constexpr size_t kMaxKnownRanges = 4096;  // bounded whatever peers send
  for (const auto& r : ranges) {
    if (f.known_ranges.size() >= kMaxKnownRanges) return;
    f.known_ranges.insert(r);
  }
}

absl::StatusOr<std::optional<Contribution>> Rounds::AddToPartialLocked(const PayloadId& id,
                                                                       EncodedPayload payload,
                                                                       uint64_t tokens,
                                                                       double sum_squares) {
  ServiceFragment& f = core_.fragments[id.fragment];
  const auto ranges = payload.Ranges();
  PartialContribution& p = f.partials[id.island_id];
  if (p.payload.chunks.empty() || p.round != id.round) {
    p = PartialContribution();  // a first part, or one abandoned for an older round
    p.round = id.round;
    p.payload.codec = core_.options.codec;
    p.tokens = tokens;
  }
  if (tokens != p.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the ranks of island '", id.island_id,
                                                   "' disagree on the tokens of round ", id.round,
                                                   ": ", tokens, " and ", p.tokens));
  }
  // A part sent again (its answer was lost) is a duplicate; a part that overlaps others is wrong.
  const auto held = p.payload.Ranges();
  const bool duplicate = std::all_of(ranges.begin(), ranges.end(), [&](const auto& r) {
    return std::any_of(held.begin(), held.end(),
                       [&](const auto& h) { return h.first <= r.first && r.second <= h.second; });
  });
  if (duplicate && !held.empty()) {
    return absl::AlreadyExistsError(absl::StrCat("island '", id.island_id,
                                                 "' has already sent "
                                                 "these elements of round ",
                                                 id.round));
  }
  if (auto s = p.payload.Merge(std::move(payload)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("contribution of island '", id.island_id,
                                                   "' to round ", id.round, ": ", s.message()));
  }
  p.sum_squares += sum_squares;
  RememberRangesLocked(f, ranges);
  if (!p.payload.Covers(f.layout.total())) return std::optional<Contribution>();
  Contribution c;
  c.payload = std::move(p.payload);
  c.tokens = p.tokens;
  c.norm = std::sqrt(p.sum_squares);
  f.partials.erase(id.island_id);
  return std::optional<Contribution>(std::move(c));
}

absl::StatusOr<pb::PushResponse> Rounds::AwaitAppliedLocked(std::unique_lock<std::mutex>& lock,
                                                            const PayloadId& id) {
  ServiceFragment& f = core_.fragments[id.fragment];
  const absl::Time deadline = absl::Now() + absl::Seconds(core_.options.round_timeout_s);
  while (true) {
    auto it = f.applied.find(id.island_id);
    if (it != f.applied.end() && it->second.first == id.round) return it->second.second;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("the other ranks of island '", id.island_id,
                                                      "' did not complete its contribution"));
    }
    core_.committed_cv.wait_until(
        lock, absl::ToChronoTime(std::min(deadline, absl::Now() + kCancelPoll)));
  }
}

absl::Status Rounds::CheckValues(const PayloadId& id, const PayloadStats& stats) const {
  if (core_.options.max_update_value > 0 && stats.max_abs > core_.options.max_update_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("contribution of island '", id.island_id, "' to round ", id.round,
                     ": a value of magnitude ", stats.max_abs,
                     " exceeds outer.max_update_value = ", core_.options.max_update_value));
  }
  return absl::OkStatus();
}

absl::Status Rounds::CheckNormLocked(const PayloadId& id, const Contribution& c) const {
  const double params_norm = core_.fragments[id.fragment].params_norm;
  if (core_.options.max_update_norm > 0 && params_norm > 0 &&
      c.norm > core_.options.max_update_norm * params_norm) {
    return absl::InvalidArgumentError(
        absl::StrCat("contribution of island '", id.island_id, "' to round ", id.round,
                     " has norm ", c.norm, ", ", c.norm / params_norm,
                     " times the fragment's parameter norm (outer.max_update_norm = ",
                     core_.options.max_update_norm, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::PushResponse> Rounds::FinishPushChecked(std::unique_ptr<PushStream> stream) {
  ATL_RETURN_IF_ERROR(stream->chunks_.CheckComplete());
  const uint64_t tokens = stream->tokens_;
  const PayloadId id = stream->chunks_.id();
  ATL_RETURN_IF_ERROR(ValidateFigures(stream->figures_));
  const double steps_per_s = stream->figures_.steps_per_s;
  EncodedPayload payload = std::move(stream->chunks_).Take();
  // Decoding the part once checks that every value is finite: a sparse part as it arrived (a
  // sparse fold reads the decoded values again where they are kept), a dense one window by window.
  auto stats = stream->meter_ ? stream->meter_->Result() : Measure(payload);
  if (!stats.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("contribution of island '", id.island_id,
                                                   "' to round ", id.round, ": ",
                                                   stats.status().message()));
  }
  ATL_RETURN_IF_ERROR(CheckValues(id, *stats));
  std::vector<CommitJob> jobs;
  absl::StatusOr<pb::PushResponse> response;
  {
    std::unique_lock<std::mutex> lock(core_.mu);
    // Other contributions may have landed, rounds committed and the island rejoined (with a new
    // session) while this one arrived.
    ATL_RETURN_IF_ERROR(core_.membership.Authenticate(id.island_id, stream->session_));
    ATL_RETURN_IF_ERROR(CheckPushLocked(id));
    ATL_RETURN_IF_ERROR(CheckClaimLocked(id, tokens));
    ATL_ASSIGN_OR_RETURN(auto complete,
                         AddToPartialLocked(id, std::move(payload), tokens, stats->sum_squares));
    ServiceFragment& frag = core_.fragments[id.fragment];
    if (!complete.has_value()) {
      // A part of the island's contribution: the rank that completes it is answered as a whole
      // push.
      if (core_.options.async) return AwaitAppliedLocked(lock, id);
      pb::PushResponse part;
      part.set_round(id.round);
      part.set_fragment(id.fragment);
      part.set_contributors(uint32_t(frag.contributions.size()));
      if (tuner_) TuneLocked(id.island_id, stream->figures_, part);
      return part;
    }
    Contribution c = std::move(*complete);
    c.step = stream->step_;
    ATL_RETURN_IF_ERROR(CheckNormLocked(id, c));
    if (core_.options.async) {
      lock.unlock();
      return ApplyAsync(id, std::move(c), steps_per_s);
    }
    response = RecordLocked(id, std::move(c), jobs);
    if (tuner_) TuneLocked(id.island_id, stream->figures_, *response);
    if (core_.options.token_budget > 0) {
      // A sync run that ends at its tokens: each island's H follows its throughput (DyLU).
      if (stream->figures_.steps_per_s > 0) {
        steps_per_s_[id.island_id] = stream->figures_.steps_per_s;
      }
      response->set_sync_every(SyncEveryLocked(id.island_id));
    }
  }
  // The contribution that completed its round commits it (outside core_.mu).
  RunCommits(std::move(jobs));
  return response;
}

void Rounds::TuneLocked(const std::string& island, const IslandFigures& figures,
                        pb::PushResponse& response) {
  if (auto choice = tuner_->Report(island, figures); choice && core_.on_event) {
    core_.on_event(absl::StrFormat(
        "auto-tune: tau = %d for a predicted compute utilization of %.1f%% (blocking: %.1f%%), "
        "from the slowest island's %.3f s per step and the slowest link's %.2f Mbit/s planned "
        "as %.2f Mbit/s (headroom %.1fx)",
        choice->tau, 100 * choice->predicted, 100 * choice->predicted_tau0, choice->step_time_s,
        choice->link_bps * core_.options.auto_tune_headroom / 1e6, choice->link_bps / 1e6,
        core_.options.auto_tune_headroom));
  }
  if (auto tau = tuner_->tau()) {
    response.set_tau_set(true);
    response.set_tau(uint32_t(*tau));
  }
}

void Rounds::SetRunTokensLocked(pb::PushResponse& response) const {
  response.set_tokens_committed(core_.tokens_committed);
  response.set_budget_reached(core_.options.token_budget > 0 &&
                              core_.tokens_committed >= core_.options.token_budget);
}

uint64_t Rounds::OpenRoundLocked(const ServiceFragment& f) const {
  return f.round + (f.committing ? 1 : 0);
}

absl::Status Rounds::CheckLateLocked(const ServiceFragment& frag, const PayloadId& id) const {
  const uint64_t stale = OpenRoundLocked(frag) - id.round;
  // A per-coordinate rule counts islands, not tokens: an island's late and on-time contributions
  // would be two votes. Late contributions fold only into the mean rules.
  const AggregationRule rule = core_.options.aggregation.rule;
  const bool per_coordinate =
      rule == AggregationRule::kTrimmedMean || rule == AggregationRule::kMedian;
  if (per_coordinate || stale > core_.options.sync_max_staleness) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", id.round, " of fragment ", id.fragment,
        id.round == frag.round ? " is being committed without this contribution"
                               : " has already committed",
        ", and it would be ", stale, " round", stale == 1 ? "" : "s", " stale (outer.max_staleness = ",
        core_.options.sync_max_staleness,
        per_coordinate ? "; late contributions fold only into the mean rules" : "",
        "); the current round is ", frag.round,
        ": fetch the global state and continue"));
  }
  if (frag.late.count(id.island_id)) {
    return absl::AlreadyExistsError(absl::StrCat("island '", id.island_id,
                                                 "' has a late contribution to fragment ",
                                                 id.fragment, " waiting already"));
  }
  return absl::OkStatus();
}

// A late contribution waits for the next commit of its fragment; it commits a round alone only
// when no member is to push to the open one (ReadyLocked: the run's last rounds).
pb::PushResponse Rounds::RecordLateLocked(const PayloadId& id, Contribution c) {
  ServiceFragment& frag = core_.fragments[id.fragment];
  const uint64_t open = OpenRoundLocked(frag);
  c.base_round = id.round;
  c.weight = WeightLocked(id, c.tokens);
  const uint64_t tokens = c.tokens;
  frag.late.emplace(id.island_id, std::move(c));
  core_.membership.Contributed(id.island_id, absl::Now()).IgnoreError();
  NoteContributedLocked(id, tokens, frag.late.at(id.island_id).step);
  pb::PushResponse response;
  response.set_round(id.round);
  response.set_fragment(id.fragment);
  response.set_contributors(uint32_t(frag.contributions.size()));
  response.set_late(true);
  SetRunTokensLocked(response);
  for (const auto& committed : frag.committed) {
    if (committed->round == id.round) {
      response.set_behind_s(std::max(
          0.0, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()) - committed->commit_unix_s));
    }
  }
  response.set_version(open);
  response.set_staleness(uint32_t(open - id.round));
  return response;
}

absl::StatusOr<pb::PushResponse> Rounds::RecordLocked(const PayloadId& id, Contribution c,
                                                      std::vector<CommitJob>& jobs) {
  ServiceFragment& frag = core_.fragments[id.fragment];
  if (id.round < OpenRoundLocked(frag)) {
    pb::PushResponse response = RecordLateLocked(id, std::move(c));
    jobs = TakeReadyLocked(absl::Now());  // the last rounds of a run may be late ones alone
    return response;
  }
  c.base_round = id.round;
  c.weight = WeightLocked(id, c.tokens);
  frag.contributions.emplace(id.island_id, std::move(c));
  const absl::Time now = absl::Now();
  core_.membership.Contributed(id.island_id, now).IgnoreError();  // a member: checked by the caller
  NoteContributedLocked(id, frag.contributions.at(id.island_id).tokens,
                        frag.contributions.at(id.island_id).step);
  if (frag.contributions.size() == 1) {
    frag.deadline = now + absl::Seconds(core_.options.round_timeout_s);
    frag.opened = now;
  }
  frag.last_arrival = now;
  if (int(frag.contributions.size()) == core_.options.min_islands) OpenGraceLocked(frag, now);
  pb::PushResponse response;
  response.set_round(id.round);
  response.set_fragment(id.fragment);
  response.set_contributors(uint32_t(frag.contributions.size()));
  SetRunTokensLocked(response);
  jobs = TakeReadyLocked(now);
  return response;
}

absl::Status Rounds::CheckAsyncLocked(const ServiceFragment& f, uint32_t fragment,
                                      const std::string& island, uint64_t base) const {
  ATL_RETURN_IF_ERROR(core_.membership.CheckMember(island));
  if (base > f.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", base, " of fragment ", fragment, " is unknown; the current version is ",
        f.round, ": fetch the global state and continue"));
  }
  if (f.round - base > core_.options.max_staleness) {
    return absl::FailedPreconditionError(
        absl::StrCat("contribution from version ", base, " of fragment ", fragment, " is ",
                     f.round - base, " versions stale (the bound is ", core_.options.max_staleness,
                     "): fetch the global state and continue"));
  }
  if (auto it = f.last_base.find(island); it != f.last_base.end() && base <= it->second) {
    return absl::AlreadyExistsError(absl::StrCat("island '", island,
                                                 "' has already contributed from version ", base,
                                                 " of fragment ", fragment));
  }
  return absl::OkStatus();
}

pb::PushResponse Rounds::VoidAsyncLocked(const PayloadId& id, const Contribution& c,
                                         uint64_t staleness) {
  ServiceFragment& frag = core_.fragments[id.fragment];
  frag.last_base[id.island_id] = id.round;
  core_.membership.Contributed(id.island_id, absl::Now()).IgnoreError();
  NoteContributedLocked(id, c.tokens, c.step);
  if (id.fragment == 0) core_.ledger.Dropped(id.island_id, "void (no change)", c.tokens);
  return AnswerAsyncLocked(id, staleness, 0);
}

pb::PushResponse Rounds::AnswerAsyncLocked(const PayloadId& id, uint64_t staleness,
                                           uint32_t contributors) {
  ServiceFragment& frag = core_.fragments[id.fragment];
  pb::PushResponse response;
  response.set_round(id.round);
  response.set_fragment(id.fragment);
  response.set_contributors(contributors);
  response.set_version(frag.round);
  response.set_staleness(uint32_t(staleness));
  response.set_sync_every(SyncEveryLocked(id.island_id));
  SetRunTokensLocked(response);
  frag.applied[id.island_id] = {id.round, response};
  return response;
}

uint32_t Rounds::SyncEveryLocked(const std::string& island) const {
  if (!core_.options.dynamic_local_steps) return core_.options.sync_every;
  auto it = steps_per_s_.find(island);
  if (it == steps_per_s_.end()) return core_.options.sync_every;
  double v_max = 0;
  for (const auto& [id, v] : steps_per_s_) v_max = std::max(v_max, v);
  return DynamicLocalSteps(it->second, v_max, core_.options.sync_every);
}

absl::StatusOr<pb::PushResponse> Rounds::ApplyAsync(const PayloadId& id, Contribution c,
                                                    double steps_per_s) {
  ServiceFragment& frag = core_.fragments[id.fragment];
  // Contributions to a fragment apply one at a time, each to the version the previous one made.
  std::lock_guard<std::mutex> data(*frag.data_mu);
  uint64_t staleness;
  double params_norm;
  std::set<std::pair<uint64_t, uint64_t>> ranges;
  AsyncStep step{c.step, 0};  // the island's step as far as the service knows: it never goes back
  SpareChunkData spare;
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    // The island may have left, or others' contributions made this one too stale, while it waited.
    ATL_RETURN_IF_ERROR(CheckAsyncLocked(frag, id.fragment, id.island_id, id.round));
    staleness = frag.round - id.round;
    params_norm = frag.params_norm;
    ranges = frag.known_ranges;
    if (auto it = done_.find(id.island_id); it != done_.end() && id.fragment < it->second.size()) {
      step.island_step = std::max(step.island_step, it->second[id.fragment].step);
    }
    step.tokens_committed = core_.tokens_committed;
    // No tokens (an island whose spike guard dropped every step since its push) or no change:
    // nothing to apply; the answer tells the island where the fragment is (Rounds::TakeVoid).
    if (c.tokens == 0 || !(c.norm > 0)) return VoidAsyncLocked(id, c, staleness);
    spare = std::exchange(frag.spare_chunks, {});
  }
  const absl::Time started = absl::Now();
  std::vector<float> g(frag.data.size());
  ATL_RETURN_IF_ERROR(c.payload.Read(0, g.size(), g.data()));
  SetStepLocked(frag, id.fragment, id.round + staleness, step);
  if (core_.options.staleness_scaling && staleness > 0 && !frag.data.optimizer().averaging()) {
    const float scale = float(1.0 / double(1 + staleness));  // (a warm-start share is not scaled)
    for (float& v : g) v *= scale;
  }
  auto result = StepLocked(frag, id.fragment, id.round + staleness, {g.data(), nullptr}, ranges,
                           {}, &spare);
  if (!result.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("contribution of island '", id.island_id,
                                                   "' refused: ", result.status().message()));
  }
  g = {};
  result->record.contributors = {id.island_id};
  result->record.accounted.emplace_back(id.island_id, c.tokens, false);
  result->record.tokens = c.tokens;
  result->record.staleness = staleness;
  result->started = started;
  result->record.relative_norms[id.island_id] = params_norm > 0 ? c.norm / params_norm : 0.0;
  std::lock_guard<std::mutex> lock(core_.mu);
  const absl::Time now = absl::Now();
  PublishLocked(id.fragment, *std::move(result), now);
  frag.last_base[id.island_id] = id.round;
  core_.membership.Contributed(id.island_id, now).IgnoreError();  // a member, or one that just left
  NoteContributedLocked(id, c.tokens, c.step);
  if (steps_per_s > 0) steps_per_s_[id.island_id] = steps_per_s;
  if (id.fragment == 0) core_.tokens_committed += c.tokens;
  return AnswerAsyncLocked(id, staleness, 1);
}

}  // namespace atl::outer
