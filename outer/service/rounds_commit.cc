// Rounds: when one is ready, how its contributions become the outer update every copy applies,
// and how islands wait for it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "outer/base/aggregation.h"
#include "outer/base/names.h"
#include "outer/service/rounds.h"
#include "outer/service/sync_server_internal.h"

namespace atl::outer {

using internal::kCommittedKept;

bool Rounds::ReadyLocked(const ServiceFragment& f, absl::Time now) const {
  if (f.contributions.empty() || f.committing) return false;
  // Before its deadline a round needs every member; the first round also waits for the run's full
  // complement of islands, so an island that is merely slower to start takes part from the start.
  const uint32_t fragment = uint32_t(&f - core_.fragments.data());
  const uint64_t first = fragment < core_.first_rounds.size() ? core_.first_rounds[fragment] : 0;
  bool all = f.round > first || core_.complement_reached;
  for (const auto& [id, m] : core_.membership.members()) {
    if (Membership::Required(m, fragment, f.round)) all &= f.contributions.count(id) > 0;
  }
  if (all) return true;
  return now >= f.deadline && int(f.contributions.size()) >= core_.options.min_islands;
}

std::vector<Rounds::CommitJob> Rounds::TakeReadyLocked(absl::Time now) {
  std::vector<CommitJob> jobs;
  for (uint32_t i = 0; i < core_.fragments.size(); ++i) {
    ServiceFragment& f = core_.fragments[i];
    if (!ReadyLocked(f, now)) continue;
    CommitJob job;
    job.fragment = i;
    job.round = f.round;
    job.contributions = std::move(f.contributions);
    job.params_norm = f.params_norm;
    job.known_ranges = f.known_ranges;
    job.opened = f.opened;
    f.contributions.clear();
    f.partials.clear();  // parts of islands that did not complete theirs in time
    f.deadline = absl::InfiniteFuture();
    f.committing = true;
    // Every member this round waited for has applied the rounds before it: a big fragment's
    // newest update goes before the next one is made, not after (see kMinCommittedKept).
    TrimCommittedLocked(f, 0, f.committed.empty() ? 0 : f.committed.back()->update_bytes);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void Rounds::RunCommits(std::vector<CommitJob> jobs) {
  for (auto& job : jobs) RunCommit(std::move(job));
}

void Rounds::RunCommit(CommitJob job) {
  ServiceFragment& f = core_.fragments[job.fragment];
  std::lock_guard<std::mutex> data(*f.data_mu);
  const absl::Time started = absl::Now();
  if (commit_hook_) commit_hook_(job.fragment);
  const size_t n = f.data.size();
  // In island-id order (std::map): the result does not depend on arrival order. The payloads are
  // shared: a relayed update keeps them.
  std::vector<ContributionRef> refs;
  std::map<std::string, std::shared_ptr<const EncodedPayload>> payloads;
  for (auto& [id, c] : job.contributions) {
    auto payload = std::make_shared<const EncodedPayload>(std::move(c.payload));
    refs.push_back({id, c.tokens, c.norm, payload.get()});
    payloads.emplace(id, std::move(payload));
  }
  std::vector<std::string> dropped, events;
  // The one accumulator, kept between commits: a fresh one would fault in 4 bytes per parameter
  // again every round (measured: a seventh of a 190M-parameter commit's time).
  if (!f.accumulator) f.accumulator.reset(new float[n]);
  float* const g = f.accumulator.get();
  std::optional<CommitResult> result;
  while (!refs.empty()) {
    AggregationReport report;
    absl::Status s = Aggregate(core_.options.aggregation, refs, n, g, &report, core_.pool.get());
    if (s.ok()) {
      Relayable relayable;
      for (size_t i = 0; i < refs.size(); ++i) {
        const double scale = i < report.scales.size() ? report.scales[i] : 1.0;
        relayable.terms.push_back({refs[i].island, refs[i].tokens, scale});
        relayable.payloads.push_back(payloads.at(refs[i].island));
      }
      auto stepped =
          StepLocked(f, job.fragment, job.round, g, job.known_ranges, std::move(relayable));
      if (stepped.ok()) {
        result = *std::move(stepped);
        RoundRecord& record = result->record;
        for (const auto& r : refs) {
          record.contributors.push_back(r.island);
          record.tokens += r.tokens;
          record.relative_norms[r.island] = job.params_norm > 0 ? r.norm / job.params_norm : 0.0;
        }
        record.aggregation = std::move(report);
        break;
      }
      s = stepped.status();
    }
    // The combination would leave the parameters non-finite (or could not be read): the round
    // commits without the contribution of largest norm, the likeliest culprit, and tries again.
    auto worst = std::max_element(refs.begin(), refs.end(),
                                  [](const auto& x, const auto& y) { return x.norm < y.norm; });
    events.push_back(absl::StrCat("round ", job.round, " of fragment ", job.fragment, ": ",
                                  s.message(), "; committing without island '", worst->island,
                                  "'"));
    dropped.push_back(worst->island);
    refs.erase(worst);
  }
  job.contributions.clear();
  if (!result) {
    // Nothing usable: the round commits with a zero update (parameters and optimizer unchanged).
    result.emplace();
    result->update = ZeroUpdate({core_.options.run_id, "", job.round, job.fragment},
                                core_.options.codec, n, core_.options.chunk_bytes);
    MeasureLocked(f, job.known_ranges, *result);
  }
  result->record.dropped = std::move(dropped);
  result->events = std::move(events);
  result->opened = job.opened;
  result->started = started;
  std::lock_guard<std::mutex> lock(core_.mu);
  PublishLocked(job.fragment, *std::move(result), absl::Now());
}

absl::StatusOr<Rounds::CommitResult> Rounds::StepLocked(
    ServiceFragment& f, uint32_t fragment, uint64_t round, const float* g,
    const std::set<std::pair<uint64_t, uint64_t>>& ranges, Relayable relayable) {
  // The update every copy applies is the decoded encoding of the optimizer's update, or one every
  // copy makes from the relayed contributions with the same functions: either way the service and
  // the islands subtract exactly the same numbers. Nothing changes until the whole update is known
  // to keep every parameter finite.
  const PayloadId id{core_.options.run_id, "", round, fragment};
  // The round's outer step, a function of the round alone, so a resumed service and a replay step
  // the same way: a warm-start round is a plain average (the momentum untouched); the others
  // follow the outer learning-rate schedule over the rounds after the warm start.
  const SyncSchedule schedule = core_.Schedule();
  const uint64_t warm = schedule.warm_start_rounds();
  const bool averaging = !core_.options.async && schedule.WarmStartRound(round);
  const uint64_t total_rounds =
      core_.options.total_inner_steps > 0
          ? schedule.RoundsUntil(int(fragment), int64_t(core_.options.total_inner_steps))
          : 0;
  f.data.set_averaging(averaging);
  f.data.set_lr(averaging ? 1.0
                          : ScheduledLr(core_.options.optimizer, round - std::min(round, warm),
                                        total_rounds - std::min(total_rounds, warm)));
  CommitResult result;
  // Mean rules only: a per-coordinate rule's result is no fold of whole contributions.
  const bool mean = core_.options.aggregation.rule == AggregationRule::kMean ||
                    core_.options.aggregation.rule == AggregationRule::kClippedMean;
  if (!core_.options.async && mean && f.data.optimizer().linear() &&
      RelayIsSmaller(core_.options.codec, uint32_t(relayable.terms.size()), f.data.size())) {
    ATL_RETURN_IF_ERROR(f.data.StepLinear(g, core_.pool.get()));
    result.recipe = {std::move(relayable.terms), float(f.data.optimizer().lr())};
    result.relayed = std::move(relayable.payloads);
  } else {
    ATL_ASSIGN_OR_RETURN(auto update,
                         f.data.PrepareUpdate(g, id, core_.options.codec, core_.options.chunk_bytes,
                                              core_.pool.get()));
    f.data.Apply(g, update, core_.pool.get());
    result.update = std::move(update);
  }
  MeasureLocked(f, ranges, result);
  return result;
}

void Rounds::MeasureLocked(const ServiceFragment& f,
                           const std::set<std::pair<uint64_t, uint64_t>>& ranges,
                           CommitResult& result) {
  const std::vector<std::pair<uint64_t, uint64_t>> list(ranges.begin(), ranges.end());
  std::vector<uint64_t> hashes(list.size());
  // Task 0 hashes the whole; the others each hash a range.
  core_.pool->ParallelFor(list.size() + 1, [&](size_t t) {
    if (t == 0) {
      result.params_hash = f.data.Hash();
    } else if (list[t - 1].second <= f.data.size()) {
      hashes[t - 1] = f.data.RangeHash(list[t - 1].first, list[t - 1].second);
    }
  });
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].second <= f.data.size()) result.range_hashes[list[i]] = hashes[i];
  }
  result.params_norm = f.data.Norm(core_.pool.get());
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
  committed->dropped = std::move(result.record.dropped);
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
  while (f.committed.size() > kept_versions()) f.committed.pop_front();
  TrimCommittedLocked(f, internal::kMinCommittedKept, 0);
  ++f.round;
  f.committing = false;
  core_.committed_cv.notify_all();
}

void Rounds::TrimCommittedLocked(ServiceFragment& f, size_t keep, uint64_t extra_bytes) {
  if (core_.options.async) return;
  uint64_t kept_bytes = extra_bytes;
  for (const auto& c : f.committed) kept_bytes += c->update_bytes;
  const uint64_t budget =
      std::max<uint64_t>(f.layout.total() * sizeof(float) / 8, internal::kCommittedKeptBytes);
  while (f.committed.size() > keep && kept_bytes > budget) {
    kept_bytes -= f.committed.front()->update_bytes;
    f.committed.pop_front();
  }
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
  return AwaitRound(request.round(), deadline, request.fragment(), cancelled);
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
