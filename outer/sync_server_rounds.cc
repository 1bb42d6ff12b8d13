// Rounds: when one is ready, how its contributions become the outer update every copy applies,
// and how islands receive it (or the whole state).
#include "outer/sync_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/checksum.h"
#include "outer/aggregation.h"
#include "outer/names.h"
#include "outer/sync_server_internal.h"

namespace atl::outer {

using internal::HashParams;
using internal::Norm;
using internal::kCommittedKept;

bool SyncServer::ReadyLocked(const Fragment& f, absl::Time now) const {
  if (f.contributions.empty()) return false;
  // Before its deadline a round needs every member; the first round also waits for the run's full
  // complement of islands, so an island that is merely slower to start takes part from the start.
  const uint32_t fragment = uint32_t(&f - fragments_.data());
  const uint64_t first = fragment < first_rounds_.size() ? first_rounds_[fragment] : 0;
  bool all = f.round > first || complement_reached_;
  for (const auto& [id, m] : membership_.members()) {
    if (Membership::Required(m, fragment, f.round)) all &= f.contributions.count(id) > 0;
  }
  if (all) return true;
  return now >= f.deadline && int(f.contributions.size()) >= options_.min_islands;
}

void SyncServer::CommitLocked(uint32_t fragment, absl::Time now) {
  Fragment& f = fragments_[fragment];
  const size_t n = f.params.size();
  // In island-id order (std::map): the result does not depend on arrival order.
  std::vector<ContributionRef> refs;
  for (const auto& [id, c] : f.contributions) refs.push_back({id, c.tokens, c.norm, &c.payload});
  std::vector<std::string> dropped;
  std::vector<float> g(n);
  while (!refs.empty()) {
    RoundRecord record;
    absl::Status s = Aggregate(options_.aggregation, refs, n, g.data(), &record.aggregation);
    if (s.ok()) {
      for (const auto& r : refs) {
        record.contributors.push_back(r.island);
        record.tokens += r.tokens;
      }
      record.dropped = dropped;
      for (const auto& r : refs) {
        record.relative_norms[r.island] = f.params_norm > 0 ? r.norm / f.params_norm : 0.0;
      }
      s = ApplyLocked(fragment, g, std::move(record), now);
      if (s.ok()) break;
    }
    // The combination would leave the parameters non-finite (or could not be read): the round
    // commits without the contribution of largest norm, the likeliest culprit, and tries again.
    auto worst = std::max_element(refs.begin(), refs.end(), [](const auto& x, const auto& y) {
      return x.norm < y.norm;
    });
    if (on_event_) {
      on_event_(absl::StrCat("round ", f.round, " of fragment ", fragment, ": ", s.message(),
                             "; committing without island '", worst->island, "'"));
    }
    dropped.push_back(worst->island);
    refs.erase(worst);
  }
  if (refs.empty()) {
    // Nothing usable: the round commits with a zero update (parameters and optimizer unchanged).
    RoundRecord record;
    record.dropped = dropped;
    CommitUpdateLocked(fragment, std::vector<float>(n, 0.0f), {}, std::move(record), now);
  }
  f.contributions.clear();
  f.partials.clear();  // parts of islands that did not complete theirs in time
  f.deadline = absl::InfiniteFuture();
}

absl::Status SyncServer::ApplyLocked(uint32_t fragment, const std::vector<float>& g,
                                     RoundRecord record, absl::Time now) {
  Fragment& f = fragments_[fragment];
  const size_t n = f.params.size();
  // The update every copy applies is the decoded encoding of the optimizer's update, so the
  // service and the islands subtract exactly the same numbers. Nothing changes until the whole
  // update is known to keep every parameter finite.
  std::vector<float> update(n);
  f.optimizer.Preview(g.data(), update.data());
  const PayloadId id{options_.run_id, "", f.round, fragment};
  auto chunks = EncodeChunks(id, options_.codec, update.data(), 0, n, n, options_.chunk_bytes);
  if (!chunks.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the outer update is not finite (", chunks.status().message(), ")"));
  }
  Assembler decoded(id, n, 0, n, options_.codec);
  for (const auto& c : *chunks) {
    if (auto s = decoded.Add(c); !s.ok()) return s;
  }
  const std::vector<float>& u = decoded.values();
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= uint32_t(!std::isfinite(f.params[i] - u[i]));
  if (bad) {
    return absl::InvalidArgumentError("the update would make the global parameters non-finite");
  }
  f.optimizer.Advance(g.data());
  CommitUpdateLocked(fragment, std::move(decoded.mutable_values()), *std::move(chunks),
                     std::move(record), now);
  return absl::OkStatus();
}

void SyncServer::CommitUpdateLocked(uint32_t fragment, std::vector<float> update,
                                    std::vector<pb::Chunk> chunks, RoundRecord record,
                                    absl::Time now) {
  Fragment& f = fragments_[fragment];
  const size_t n = f.params.size();
  if (chunks.empty()) {  // a zero update still travels, so that islands apply it like any other
    chunks = *EncodeChunks({options_.run_id, "", f.round, fragment}, options_.codec, update.data(),
                           0, n, n, options_.chunk_bytes);
  }
  auto committed = std::make_shared<CommittedRound>();
  committed->round = f.round;
  committed->fragment = fragment;
  committed->contributors = std::move(record.contributors);
  committed->tokens = record.tokens;
  committed->staleness = record.staleness;
  committed->dropped = std::move(record.dropped);
  committed->aggregation = std::move(record.aggregation);
  committed->relative_norms = std::move(record.relative_norms);
  committed->update = std::move(update);
  ApplyUpdate(f.params.data(), committed->update.data(), n);
  for (const auto& [begin, end] : f.known_ranges) {
    if (end <= n) committed->range_hashes[{begin, end}] = HashParams(f.params.data() + begin, end - begin);
  }
  f.params_hash = HashParams(f.params);
  f.params_norm = Norm(f.params);
  committed->params_hash = f.params_hash;
  committed->commit_unix_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  committed->update_chunks = std::move(chunks);
  if (on_commit_) on_commit_(*committed);
  f.committed.push_back(std::move(committed));
  while (f.committed.size() > kept_versions()) f.committed.pop_front();
  ++f.round;
  committed_cv_.notify_all();
}

bool SyncServer::AllDoneLocked() const {
  if (options_.async) return options_.token_budget > 0 && tokens_committed_ >= options_.token_budget;
  const uint64_t steps = options_.total_inner_steps;
  return steps > 0 && fragments_[0].round * options_.sync_every >= steps;
}

size_t SyncServer::kept_versions() const {
  // Async: enough for an island to catch up from the stalest base accepted, while every other
  // island pushes once more.
  return options_.async ? std::max<size_t>(kCommittedKept, options_.max_staleness +
                                                               2 * size_t(options_.num_data_streams))
                        : kCommittedKept;
}

absl::StatusOr<std::shared_ptr<const CommittedRound>> SyncServer::AwaitUpdate(
    const pb::UpdateRequest& request, absl::Time deadline, const std::function<bool()>& cancelled) {
  if (auto s = CheckRun(request.run_id()); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto s = membership_.Authenticate(request.island_id(), request.session()); !s.ok()) {
      return s;
    }
  }
  return AwaitRound(request.round(), deadline, request.fragment(), cancelled);
}

absl::StatusOr<std::shared_ptr<const CommittedRound>> SyncServer::AwaitRound(
    uint64_t round, absl::Time deadline, uint32_t fragment,
    const std::function<bool()>& cancelled) {
  auto fid = CheckFragment(fragment);
  if (!fid.ok()) return fid.status();
  std::unique_lock<std::mutex> lock(mu_);
  Fragment& f = fragments_[*fid];
  if (round > f.round) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round, " of fragment ", *fid,
                                                      " is unknown; the current round is ", f.round));
  }
  auto released = [&] { return f.round > round && (!durability_gate_ || f.durable_round > round); };
  while (!released()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "round ", round, " of fragment ", *fid,
          f.round > round ? " is not durable yet" : " has not committed yet"));
    }
    if (cancelled && cancelled()) return absl::CancelledError("the caller went away");
    const absl::Time wake = cancelled ? std::min(deadline, now + kCancelPoll) : deadline;
    committed_cv_.wait_until(lock, absl::ToChronoTime(wake));
  }
  for (const auto& c : f.committed) {
    if (c->round == round) return c;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("round ", round, " is too old to replay; fetch the global state"));
}

absl::StatusOr<std::vector<pb::StateChunk>> SyncServer::FetchState(
    const pb::FetchStateRequest& request) {
  if (auto s = CheckRun(request.run_id()); !s.ok()) return s;
  auto fid = CheckFragment(request.fragment());
  if (!fid.ok()) return fid.status();
  std::vector<float> snapshot;  // of the range asked for only
  uint64_t round, hash, total, n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto s = membership_.Authenticate(request.island_id(), request.session()); !s.ok()) {
      return s;
    }
    const Fragment& f = fragments_[*fid];
    total = f.params.size();
    if (request.offset() > total) {
      return absl::OutOfRangeError(absl::StrCat("offset ", request.offset(),
                                                " is past the fragment's ", total, " elements"));
    }
    n = request.num_elements() == 0
            ? total - request.offset()
            : std::min<uint64_t>(request.num_elements(), total - request.offset());
    snapshot.assign(f.params.begin() + int64_t(request.offset()),
                    f.params.begin() + int64_t(request.offset() + n));
    round = f.round;
    hash = f.params_hash;
  }
  const uint64_t range_hash = HashParams(snapshot);
  auto chunks = EncodeChunks({options_.run_id, "", round, *fid}, {compression::Codec::kFp32, 0},
                             snapshot.data(), request.offset(), n, total, options_.chunk_bytes);
  if (!chunks.ok()) return chunks.status();
  std::vector<pb::StateChunk> out;
  out.reserve(chunks->size());
  for (auto& c : *chunks) {
    pb::StateChunk s;
    *s.mutable_chunk() = std::move(c);
    s.set_params_hash(hash);
    s.set_range_hash(range_hash);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace atl::outer
