// Rounds: how a ready round's contributions (outer/service/rounds_ready.cc) become the outer
// update every copy applies, and how islands wait for it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "outer/base/aggregation.h"
#include "outer/base/names.h"
#include "outer/service/rounds.h"
#include "outer/service/sync_server_internal.h"

namespace atl::outer {

using internal::kCommittedKept;

Rounds::Rounds(ServiceCore& core)
    : core_(core),
      kept_budget_(KeptBudgetBytes(core)),
      push_buffers_(RoundContributionBytes(core)),
      copy_seed_((uint64_t(std::random_device()()) << 32) ^ std::random_device()()) {
  StartTuner();
}

void Rounds::StartTuner() {
  if (!(core_.options.auto_tune_target > 0) || core_.options.async) return;
  PlanInput run;
  for (const auto& f : core_.fragments) run.fragment_elements.push_back(f.layout.total());
  run.method = PlanMethod::kStreaming;
  run.sync_every = int(core_.options.sync_every);
  run.codec = core_.options.codec;
  run.islands = int(core_.options.num_data_streams);
  tuner_ = std::make_unique<TauTuner>(std::move(run), core_.options.auto_tune_target,
                                      core_.options.auto_tune_headroom);
}

uint64_t Rounds::KeptBudgetBytes(const ServiceCore& core) {
  uint64_t n = 0;
  for (const auto& f : core.fragments) n += f.layout.total();
  return sizeof(float) * n;
}

uint64_t Rounds::RoundContributionBytes(const ServiceCore& core) {
  // Dense contributions are the biggest memory of a round: held between rounds they would add
  // their size to the service's resident set (measured: FP4, 494M parameters, 8 islands: peak
  // 8.50 GiB against 8.26, past the load test's budget, and no faster pushes).
  if (!core.options.codec.sparse()) return 0;
  uint64_t bytes = 0;
  for (const auto& f : core.fragments) {
    bytes += compression::EncodedBytes(core.options.codec, f.layout.total());
  }
  return bytes * std::max<uint64_t>(1, core.options.num_data_streams);
}

bool Rounds::MayFoldSparsely() const {
  return !core_.options.async && core_.options.sparse_commits && core_.options.codec.sparse() &&
         FoldsWholeContributions(core_.options.aggregation.rule);
}

// In island-id order (std::map), the on-time contributions, then the late ones: the result does
// not depend on arrival order. Each weighs its tokens (at most one round's: WeightLocked), a late
// one its tokens / (1 + staleness), the rule async mode's staleness scaling follows
// (outer.staleness_scaling; FedAsync's polynomial staleness weight with a = 1, Xie et al. 2019);
// BoundLateShares then caps what the late ones move. The payloads are shared: a relayed update
// keeps them.
std::vector<Rounds::CommitEntry> Rounds::CommitEntries(CommitJob& job) const {
  std::vector<CommitEntry> entries;
  for (auto* from : {&job.contributions, &job.late}) {
    for (auto& [id, c] : *from) {
      CommitEntry e;
      e.late = from == &job.late;
      e.tokens = c.tokens;
      e.weight = std::max<uint64_t>(1, c.weight > 0 ? c.weight : c.tokens);
      const uint64_t stale = e.late ? job.round - std::min(job.round, c.base_round) : 0;
      e.payload = std::make_shared<EncodedPayload>(std::move(c.payload));
      e.ref = {id, std::max<uint64_t>(1, e.weight / (1 + stale)), c.norm, e.payload.get()};
      entries.push_back(std::move(e));
    }
  }
  job.contributions.clear();
  job.late.clear();
  return entries;
}

// A late contribution's effect is bounded by its own staleness, never by who else pushed: it
// moves the model at most tokens / (1 + staleness) over the round's tokens, every contribution's
// counted whole. Its weight in the mean (tokens / (1 + staleness) against the on-time ones'
// tokens) would give it more when the on-time work is small: alone, its whole step (on a chaos
// run, 93% of a round was a one-round-old pseudo-gradient, on top of the round that had moved the
// model from its base). The on-time contributions keep their shares; what the cap takes from a
// late one goes to no one. With no late contribution nothing changes.
void Rounds::BoundLateShares(std::vector<CommitEntry>& entries) {
  double weighed = 0, whole = 0;  // the mean's tokens; the round's, late ones whole
  bool any_late = false;
  for (const auto& e : entries) {
    weighed += double(e.ref.tokens);
    whole += double(e.late ? e.weight : e.ref.tokens);
    any_late = any_late || e.late;
  }
  if (!any_late) return;
  for (auto& e : entries) e.ref.discount = e.late ? weighed / whole : 1.0;
}

absl::Status Rounds::FoldLocked(ServiceFragment& f, const std::vector<ContributionRef>& refs,
                               AggregationReport* report, Gradient* g) {
  const size_t n = f.data.size();
  // A linear step over sparse contributions touches only the coordinates they kept.
  if (!core_.options.async && core_.options.sparse_commits && f.data.optimizer().linear() &&
      AggregatesSparsely(core_.options.aggregation, refs)) {
    g->sparse = &f.sparse_sums;
    return AggregateSparse(core_.options.aggregation, refs, n, report, &f.sparse_sums,
                           core_.pool.get());
  }
  // The one accumulator, kept between commits: a fresh one would fault in 4 bytes per parameter
  // again every round (measured: a seventh of a 190M-parameter commit's time).
  if (!f.accumulator) f.accumulator.reset(new float[n]);
  g->dense = f.accumulator.get();
  return Aggregate(core_.options.aggregation, refs, n, f.accumulator.get(), report,
                   core_.pool.get());
}

// A contribution of no tokens (an island whose spike guard dropped every step it trained since its
// push) or of no change (all zero: tokens claimed for no work) is left out of the fold, where it
// would only shrink the others' shares or carry what no step made, and its tokens are not counted
// as committed.
Rounds::Dropped Rounds::TakeVoid(const CommitJob& job, std::vector<CommitEntry>& entries,
                                 std::vector<std::string>& events) const {
  Dropped voided;
  for (auto it = entries.begin(); it != entries.end();) {
    if (it->ref.norm > 0 && it->tokens > 0) {
      ++it;
      continue;
    }
    events.push_back(absl::StrCat("round ", job.round, " of fragment ", job.fragment, ": island '",
                                  it->ref.island, "' contributed no work (", it->tokens,
                                  " tokens, norm ", it->ref.norm, "); left out of the average"));
    voided.emplace_back(it->ref.island, it->tokens);
    it = entries.erase(it);
  }
  return voided;
}

std::optional<Rounds::CommitResult> Rounds::AggregateAndStep(ServiceFragment& f,
                                                             CommitJob& job,
                                                             std::vector<CommitEntry>& entries,
                                                             Dropped& dropped,
                                                             std::vector<std::string>& events) {
  const size_t n = f.data.size();
  const ScoreReport scores = ScoreEntries(f, job, entries, dropped, events);
  std::vector<std::string> purged;  // left out by the scoring, carried by the outer momentum
  for (const auto& [island, s] : scores.islands) {
    if (s.excluded && f.last_folded.count(island) > 0) purged.push_back(island);
  }
  while (!entries.empty()) {
    SetStepLocked(f, job.fragment, job.round);
    BoundLateShares(entries);
    std::vector<ContributionRef> refs;
    bool any_late = false;
    for (const auto& e : entries) {
      refs.push_back(e.ref);
      any_late = any_late || e.late;
    }
    AggregationReport report;
    report.scores = scores;
    // Copies weigh as one (their tokens divided among them), in the fold and in a relayed recipe.
    WeighCopies(core_.options.aggregation.copies, refs, n, CopySeed(job), &report.copies);
    Gradient g;
    absl::Status s = FoldLocked(f, refs, &report, &g);
    const bool restart = s.ok() && g.dense != nullptr &&
                         GuardsTheStep(f, job, g.dense, purged, &report.scores, events);
    // The decoded kept values have served (a relayed payload is kept without them; a retry decodes).
    for (auto& e : entries) e.payload->DropKept();
    if (s.ok()) {
      Relayable relayable;
      relayable.allowed = !any_late;
      for (size_t i = 0; i < refs.size(); ++i) {
        const double scale = i < report.scales.size() ? report.scales[i] : 1.0;
        relayable.terms.push_back({refs[i].island, refs[i].tokens, scale});
        relayable.payloads.push_back(entries[i].payload);
      }
      auto stepped =
          StepLocked(f, job.fragment, job.round, g, job.known_ranges, std::move(relayable),
                     &job.spare);
      if (stepped.ok()) {
        if (restart) f.data.RestartOptimizer();
        if (core_.options.scoring.loss_probe) {  // the step guard's (only with scoring)
          f.last_folded.clear();
          for (const auto& e : entries) f.last_folded.insert(e.ref.island);
        }
        RoundRecord& record = stepped->record;
        for (const auto& e : entries) {
          (e.late ? record.stale_contributors : record.contributors).push_back(e.ref.island);
          record.accounted.emplace_back(e.ref.island, e.tokens, e.late);
          record.tokens += e.tokens;
          if (e.late) record.stale_tokens += e.tokens;
          if (!e.late) {
            record.relative_norms[e.ref.island] =
                job.params_norm > 0 ? e.ref.norm / job.params_norm : 0.0;
          }
        }
        record.aggregation = std::move(report);
        return *std::move(stepped);
      }
      s = stepped.status();
    }
    // The combination would leave the parameters non-finite (or could not be read): the round
    // commits without the contribution of largest norm, the likeliest culprit, and tries again.
    auto worst = std::max_element(entries.begin(), entries.end(), [](const auto& x, const auto& y) {
      return x.ref.norm < y.ref.norm;
    });
    events.push_back(absl::StrCat("round ", job.round, " of fragment ", job.fragment, ": ",
                                  s.message(), "; committing without island '", worst->ref.island,
                                  "'", worst->late ? " (late)" : ""));
    dropped.emplace_back(worst->ref.island, worst->tokens);
    entries.erase(worst);
  }
  return std::nullopt;
}

void Rounds::RunCommit(CommitJob job) {
  ServiceFragment& f = core_.fragments[job.fragment];
  std::lock_guard<std::mutex> data(*f.data_mu);
  const absl::Time started = absl::Now();
  if (commit_hook_) commit_hook_(job.fragment);
  Dropped dropped;
  std::vector<std::string> events;
  std::vector<CommitEntry> entries = CommitEntries(job);
  Dropped voided = TakeVoid(job, entries, events);
  std::optional<CommitResult> result = AggregateAndStep(f, job, entries, dropped, events);
  if (core_.options.scoring.loss_probe && core_.options.loss_probe) {
    core_.options.loss_probe->Set(job.fragment, f.data.params().data(), f.data.size());
  }
  for (auto& e : entries) {
    if (e.payload.use_count() == 1) push_buffers_.Recycle(e.payload->chunks);  // not relayed
  }
  if (!result) {
    // Nothing usable: the round commits with a zero update (parameters and optimizer unchanged),
    // which is no progress: its tokens reached no model.
    result.emplace();
    result->record.progress = false;
    result->update = ZeroUpdate({core_.options.run_id, "", job.round, job.fragment},
                                core_.options.codec, f.data.size(), core_.options.chunk_bytes);
    MeasureLocked(f, job.known_ranges, *result);
  }
  for (const auto& [island, tokens] : dropped) result->record.dropped.push_back(island);
  result->record.dropped_tokens = std::move(dropped);
  result->record.voided = std::move(voided);
  result->events = std::move(events);
  result->opened = job.opened;
  result->record.grace_s = job.grace_s;
  result->started = started;
  std::lock_guard<std::mutex> lock(core_.mu);
  PublishLocked(job.fragment, *std::move(result), absl::Now());
}

void Rounds::SetStepLocked(ServiceFragment& f, uint32_t fragment, uint64_t round,
                           AsyncStep async) const {
  // Sync: a function of the round alone, so a resumed service and a replay step the same way: a
  // warm-start round is a plain average (the momentum untouched); the others follow the outer
  // learning-rate schedule over the rounds after the warm start. Async: of `async` alone.
  const SyncSchedule schedule = core_.Schedule();
  const uint64_t warm = schedule.warm_start_rounds();
  const uint64_t total_rounds =
      core_.options.total_inner_steps > 0
          ? schedule.RoundsUntil(int(fragment), int64_t(core_.options.total_inner_steps))
          : 0;
  if (core_.options.async) {
    // A contribution of the island's warm start is its share of a plain average: g / N, N the
    // delayed Nesterov period (the islands, by default), so that N islands' one-step pushes move
    // the parameters as a sync warm-start round does; the momentum is untouched. The others
    // follow the schedule at the round of H steps the run's progress (its tokens) has reached.
    const bool averaging = async.island_step > 0 && async.island_step <= warm;
    const uint64_t budget = core_.options.token_budget;
    const double progress =
        budget > 0 ? std::min(1.0, double(async.tokens_committed) / double(budget)) : 0.0;
    const uint64_t at = std::min(total_rounds, uint64_t(progress * double(total_rounds)));
    f.data.set_averaging(averaging);
    f.data.set_lr(averaging ? 1.0 / double(std::max(1, core_.options.optimizer.momentum_delay))
                            : ScheduledLr(core_.options.optimizer, at, total_rounds));
    return;
  }
  const bool averaging = schedule.WarmStartRound(round);
  f.data.set_averaging(averaging);
  f.data.set_lr(averaging ? 1.0
                          : ScheduledLr(core_.options.optimizer, round - std::min(round, warm),
                                        total_rounds - std::min(total_rounds, warm)));
}

absl::StatusOr<Rounds::CommitResult> Rounds::StepLocked(
    ServiceFragment& f, uint32_t fragment, uint64_t round, Gradient g,
    const std::set<std::pair<uint64_t, uint64_t>>& ranges, Relayable relayable,
    SpareChunkData* spare) {
  // The update every copy applies is the decoded encoding of the optimizer's update, or one every
  // copy makes from the relayed contributions with the same functions: either way the service and
  // the islands subtract exactly the same numbers. Nothing changes until the whole update is known
  // to keep every parameter finite.
  const PayloadId id{core_.options.run_id, "", round, fragment};
  CommitResult result;
  // Mean rules only: a per-coordinate rule's result is no fold of whole contributions.
  const bool mean = FoldsWholeContributions(core_.options.aggregation.rule);
  if (!core_.options.async && mean && relayable.allowed && f.data.optimizer().linear() &&
      RelayIsSmaller(core_.options.codec, uint32_t(relayable.terms.size()), f.data.size())) {
    ATL_RETURN_IF_ERROR(g.sparse ? f.data.StepLinearSparse(*g.sparse, core_.pool.get())
                                 : f.data.StepLinear(g.dense, core_.pool.get()));
    result.recipe = {std::move(relayable.terms), float(f.data.optimizer().lr())};
    result.relayed = std::move(relayable.payloads);
  } else if (g.sparse) {
    ATL_ASSIGN_OR_RETURN(result.update,
                         f.data.StepSparse(*g.sparse, id, core_.options.codec,
                                           core_.options.chunk_bytes, core_.pool.get(),
                                           &f.sparse_update, spare));
  } else {
    ATL_ASSIGN_OR_RETURN(auto update,
                         f.data.PrepareUpdate(g.dense, id, core_.options.codec,
                                              core_.options.chunk_bytes, core_.pool.get(), spare));
    f.data.Apply(g.dense, update, core_.pool.get());
    result.update = std::move(update);
  }
  MeasureLocked(f, ranges, result);
  return result;
}

void Rounds::MeasureLocked(ServiceFragment& f,
                           const std::set<std::pair<uint64_t, uint64_t>>& ranges,
                           CommitResult& result) {
  // Kept up to date by the step itself: sums of the tracked segments' hashes.
  f.data.TrackRanges(ranges);
  result.params_hash = f.data.Hash();
  for (const auto& range : ranges) {
    if (range.second <= f.data.size()) {
      result.range_hashes[range] = f.data.RangeHash(range.first, range.second);
    }
  }
  result.params_norm = f.data.Norm();
}

void Rounds::PublishLocked(uint32_t fragment, CommitResult result, absl::Time now) {
  ServiceFragment& f = core_.fragments[fragment];
  if (core_.on_event) {
    for (const auto& e : result.events) core_.on_event(e);
  }
  auto committed = std::make_shared<CommittedRound>();
  committed->round = f.round;
  committed->fragment = fragment;
  committed->contributors = std::move(result.record.contributors);
  committed->tokens = result.record.tokens;
  committed->staleness = result.record.staleness;
  committed->grace_s = result.record.grace_s;
  // Sync: the run's tokens (async counts its own as each contribution is applied).
  if (!core_.options.async && fragment == 0) core_.tokens_committed += result.record.tokens;
  committed->run_tokens = core_.tokens_committed;
  committed->stale_contributors = std::move(result.record.stale_contributors);
  committed->stale_tokens = result.record.stale_tokens;
  committed->dropped = std::move(result.record.dropped);
  committed->progress = result.record.progress;
  for (const auto& [island, tokens] : result.record.voided) committed->voided.push_back(island);
  if (fragment == 0) {
    for (const auto& [island, tokens] : result.record.voided) {
      core_.ledger.Dropped(island, "void (no change)", tokens);
    }
    for (const auto& [island, tokens, stale] : result.record.accounted) {
      core_.ledger.Committed(island, tokens, stale);
    }
    const auto& scores = result.record.aggregation.scores.islands;
    for (const auto& [island, tokens] : result.record.dropped_tokens) {
      const auto score = scores.find(island);
      const char* why = "dropped (non-finite combination)";
      if (score != scores.end() && score->second.harmful) {
        why = "excluded (harmful round)";
      } else if (score != scores.end() && score->second.excluded) {
        why = "excluded (reputation)";
      }
      core_.ledger.Dropped(island, why, tokens);
    }
    committed->ledger = core_.ledger.TakeSlice();
  }
  committed->aggregation = std::move(result.record.aggregation);
  committed->relative_norms = std::move(result.record.relative_norms);
  committed->range_hashes = std::move(result.range_hashes);
  f.params_hash = result.params_hash;
  f.params_norm = result.params_norm;
  committed->params_hash = f.params_hash;
  committed->commit_unix_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  if (result.opened != absl::InfinitePast())
    committed->round_s = absl::ToDoubleSeconds(now - result.opened);
  if (result.started != absl::InfinitePast())
    committed->commit_s = absl::ToDoubleSeconds(now - result.started);
  committed->update_chunks = std::move(result.update);
  for (const auto& c : committed->update_chunks) committed->update_bytes += c.data().size();
  committed->recipe = std::move(result.recipe);
  committed->relayed = std::move(result.relayed);
  committed->relayed_codec = core_.options.codec;
  for (const auto& p : committed->relayed) committed->update_bytes += p->bytes();
  if (core_.on_commit) core_.on_commit(*committed);
  f.committed.push_back(std::move(committed));
  while (f.committed.size() > kept_versions()) RetireOldestLocked(f);
  TrimCommittedLocked(f, internal::kMinCommittedKept, 0);
  WarmSpareLocked(fragment);
  ++f.round;
  f.committing = false;
  core_.committed_cv.notify_all();
}

namespace {

// The encoded updates a fragment keeps, with `extra_bytes` to come.
uint64_t KeptUpdateBytes(const ServiceFragment& f, uint64_t extra_bytes) {
  uint64_t bytes = extra_bytes;
  for (const auto& c : f.committed) bytes += c->update_bytes;
  return bytes;
}

}  // namespace

void Rounds::TrimCommittedLocked(ServiceFragment& f, size_t keep, uint64_t extra_bytes) {
  if (core_.options.async) return;
  uint64_t kept_bytes = KeptUpdateBytes(f, extra_bytes);
  const uint64_t budget = CommittedBudgetBytes(f);
  while (f.committed.size() > keep && kept_bytes > budget) {
    kept_bytes -= f.committed.front()->update_bytes;
    RetireOldestLocked(f);
  }
}

uint64_t Rounds::CommittedBudgetBytes(const ServiceFragment& f) {
  return std::max<uint64_t>(f.layout.total() * sizeof(float) / 8, internal::kCommittedKeptBytes);
}

void Rounds::WarmSpareLocked(uint32_t fragment) {
  ServiceFragment& f = core_.fragments[fragment];
  if (core_.options.async || f.spare_warming || f.committed.empty()) return;
  const CommittedRound& newest = *f.committed.back();
  const size_t have = f.spare_chunks.buffers.size();
  if (newest.update_chunks.size() <= have) return;
  // The next take retires rounds (handing their buffers over) when the kept updates with one
  // more like the newest exceed the budget (TrimCommittedLocked); else the buffers are made here.
  if (KeptUpdateBytes(f, newest.update_bytes) > CommittedBudgetBytes(f)) return;
  std::vector<size_t> sizes;
  for (size_t c = have; c < newest.update_chunks.size(); ++c) {
    sizes.push_back(newest.update_chunks[c].data().size());
  }
  f.spare_warming = true;
  background_.Post([this, fragment, sizes = std::move(sizes)] {
    std::vector<std::string> buffers = WrittenBuffers(sizes);
    std::lock_guard<std::mutex> lock(core_.mu);
    ServiceFragment& f = core_.fragments[fragment];
    for (auto& b : buffers) f.spare_chunks.Add(b, f.layout.total());
    f.spare_warming = false;
  });
}

void Rounds::RetireOldestLocked(ServiceFragment& f) {
  // Under mu nobody can take a new reference (AwaitRound copies it under mu): one is the deque's.
  std::shared_ptr<CommittedRound>& oldest = f.committed.front();
  if (oldest.use_count() == 1) f.spare_chunks.Keep(oldest->update_chunks, f.layout.total());
  f.committed.pop_front();
}

size_t Rounds::kept_versions() const {
  // Async: enough for an island to catch up from the stalest base accepted, while every other
  // island pushes once more.
  return core_.options.async
             ? std::max<size_t>(kCommittedKept, core_.options.max_staleness +
                                                    2 * size_t(core_.options.num_data_streams))
             : kCommittedKept;
}

absl::StatusOr<std::shared_ptr<const CommittedRound>> Rounds::AwaitUpdate(
    const pb::UpdateRequest& request, absl::Time deadline, const std::function<bool()>& cancelled) {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    ATL_RETURN_IF_ERROR(core_.membership.Authenticate(request.island_id(), request.session()));
  }
  ATL_ASSIGN_OR_RETURN(const uint32_t fid, core_.CheckFragment(request.fragment()));
  ATL_RETURN_IF_ERROR(CheckRange(request.offset(), request.num_elements(),
                                 core_.fragments[fid].layout.total(), fid));
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    ATL_RETURN_IF_ERROR(CheckPushKeptLocked(request, fid));
  }
  return AwaitRound(request.round(), deadline, request.fragment(), cancelled);
}

absl::Status Rounds::CheckPushKeptLocked(const pb::UpdateRequest& request, uint32_t fid) const {
  const ServiceFragment& f = core_.fragments[fid];
  const bool resumed_round = core_.resumed && !core_.options.async && request.round() == f.round &&
                             !f.committing && fid < core_.first_rounds.size() &&
                             f.round == core_.first_rounds[fid];
  if (!resumed_round || f.contributions.count(request.island_id()) ||
      f.late.count(request.island_id())) {
    return absl::OkStatus();
  }
  // A rank's range is kept when the island's partial contribution overlaps it.
  const uint64_t begin = request.offset();
  const uint64_t end =
      request.num_elements() == 0 ? f.layout.total() : begin + request.num_elements();
  if (auto it = f.partials.find(request.island_id()); it != f.partials.end()) {
    for (const auto& [b, e] : it->second.payload.Ranges()) {
      if (b < end && begin < e) return absl::OkStatus();
    }
  }
  return absl::AbortedError(absl::StrCat(
      "round ", f.round, " of fragment ", fid, " holds no contribution of island '",
      request.island_id(), "' for [", begin, ", ", end,
      "): this service resumed from its durable state since; push it again"));
}

absl::StatusOr<std::shared_ptr<const CommittedRound>> Rounds::AwaitRound(
    uint64_t round, absl::Time deadline, uint32_t fragment,
    const std::function<bool()>& cancelled) {
  ATL_ASSIGN_OR_RETURN(auto fid, core_.CheckFragment(fragment));
  std::unique_lock<std::mutex> lock(core_.mu);
  ServiceFragment& f = core_.fragments[fid];
  if (round > f.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", round, " of fragment ", fid, " is unknown; the current round is ", f.round));
  }
  auto released = [&] {
    return f.round > round && (!core_.durability_gate || f.durable_round > round);
  };
  while (!released()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("round ", round, " of fragment ", fid,
                       f.round > round ? " is not durable yet" : " has not committed yet"));
    }
    if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
    const absl::Time wake = cancelled ? std::min(deadline, now + kCancelPoll) : deadline;
    core_.committed_cv.wait_until(lock, absl::ToChronoTime(wake));
  }
  for (const auto& c : f.committed) {
    if (c->round == round) return c;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("round ", round, " is too old to replay; fetch the global state"));
}

}  // namespace atl::outer
