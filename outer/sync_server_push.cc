// The service side of a push: a stream checked message by message, a contribution recorded
// (sync) or applied (async) once verified.
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

PushStream::PushStream(SyncServer* server, ChunkStream chunks, std::string session,
                       uint64_t tokens, double steps_per_s)
    : server_(server),
      chunks_(std::move(chunks)),
      session_(std::move(session)),
      tokens_(tokens),
      steps_per_s_(steps_per_s) {}

PushStream::~PushStream() { server_->ClosePush(chunks_.id()); }

absl::Status PushStream::Add(pb::PushRequest&& request) {
  return chunks_.Add(std::move(*request.mutable_chunk()));
}

absl::Status SyncServer::CheckPushLocked(const PayloadId& id) const {
  const Fragment& frag = fragments_[id.fragment];
  if (options_.async) return CheckAsyncLocked(frag, id.fragment, id.island_id, id.round);
  if (auto s = membership_.CheckMember(id.island_id); !s.ok()) return s;
  if (id.round != frag.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "round ", id.round, " of fragment ", id.fragment,
        id.round < frag.round ? " has already committed" : " is unknown",
        "; the current round is ", frag.round, ": fetch the global state and continue"));
  }
  if (frag.contributions.count(id.island_id)) {
    return absl::AlreadyExistsError(absl::StrCat("island '", id.island_id,
                                                 "' has already contributed to round ", id.round));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PushStream>> SyncServer::OpenPush(const pb::PushRequest& first) {
  const auto& h = first.chunk().header();
  if (auto s = CheckRun(h.run_id()); !s.ok()) return s;
  auto fid = CheckFragment(h.fragment());
  if (!fid.ok()) return fid.status();
  const PayloadId id{options_.run_id, h.island_id(), h.round(), *fid};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto s = membership_.Authenticate(id.island_id, first.session()); !s.ok()) return s;
    if (auto s = CheckPushLocked(id); !s.ok()) return s;
    if (!open_pushes_.emplace(id.island_id, id.fragment).second) {
      return absl::UnavailableError(absl::StrCat("a push of island '", id.island_id,
                                                 "' for fragment ", id.fragment,
                                                 " is already under way; retry when it has ended"));
    }
  }
  const uint64_t total = fragments_[*fid].layout.total();
  return std::unique_ptr<PushStream>(new PushStream(
      this, ChunkStream(id, options_.codec, total, 0, total), first.session(), first.tokens(),
      first.inner_steps_per_s()));
}

void SyncServer::ClosePush(const PayloadId& id) {
  std::lock_guard<std::mutex> lock(mu_);
  open_pushes_.erase({id.island_id, id.fragment});
}

absl::StatusOr<pb::PushResponse> SyncServer::FinishPush(std::unique_ptr<PushStream> stream) {
  if (auto s = stream->chunks_.CheckComplete(); !s.ok()) return s;
  if (stream->tokens_ == 0) {
    return absl::InvalidArgumentError("a contribution must weigh at least 1 token");
  }
  const double steps_per_s = stream->steps_per_s_;
  if (!(steps_per_s >= 0) || !std::isfinite(steps_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("inner throughput must be a finite number >= 0, got ", steps_per_s));
  }
  const PayloadId id = stream->chunks_.id();
  Contribution c;
  c.tokens = stream->tokens_;
  c.payload = std::move(stream->chunks_).Take();
  // Decoding the whole contribution once (window by window) checks that every value is finite.
  auto stats = Measure(c.payload);
  if (!stats.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("contribution of island '", id.island_id,
                                                   "' to round ", id.round, ": ",
                                                   stats.status().message()));
  }
  c.norm = stats->norm;
  if (options_.max_update_value > 0 && stats->max_abs > options_.max_update_value) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution of island '", id.island_id, "' to round ", id.round, ": a value of magnitude ",
        stats->max_abs, " exceeds outer.max_update_value = ", options_.max_update_value));
  }
  if (options_.max_tokens > 0 && c.tokens > options_.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution of island '", id.island_id, "' claims ", c.tokens,
        " tokens; a round of this run trains at most ", options_.max_tokens));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (const double params_norm = fragments_[id.fragment].params_norm;
      options_.max_update_norm > 0 && params_norm > 0 &&
      c.norm > options_.max_update_norm * params_norm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contribution of island '", id.island_id, "' to round ", id.round, " has norm ", c.norm,
        ", ", c.norm / params_norm, " times the fragment's parameter norm (outer.max_update_norm = ",
        options_.max_update_norm, ")"));
  }
  // Other contributions may have landed, rounds committed and the island rejoined (with a new
  // session) while this one arrived.
  if (auto s = membership_.Authenticate(id.island_id, stream->session_); !s.ok()) return s;
  if (auto s = CheckPushLocked(id); !s.ok()) return s;
  if (options_.async) return ApplyAsyncLocked(id, std::move(c), steps_per_s);
  return RecordLocked(id, std::move(c));
}

absl::StatusOr<pb::PushResponse> SyncServer::Push(const std::vector<pb::PushRequest>& requests) {
  if (requests.empty()) return absl::InvalidArgumentError("empty push: no chunks");
  auto stream = OpenPush(requests.front());
  if (!stream.ok()) return stream.status();
  for (const auto& r : requests) {
    if (auto s = (*stream)->Add(pb::PushRequest(r)); !s.ok()) return s;
  }
  return FinishPush(*std::move(stream));
}

absl::StatusOr<pb::PushResponse> SyncServer::RecordLocked(const PayloadId& id, Contribution c) {
  Fragment& frag = fragments_[id.fragment];
  frag.contributions.emplace(id.island_id, std::move(c));
  const absl::Time now = absl::Now();
  membership_.Contributed(id.island_id, now).IgnoreError();  // a member: checked by the caller
  if (frag.contributions.size() == 1) {
    frag.deadline = now + absl::Seconds(options_.round_timeout_s);
  }
  pb::PushResponse response;
  response.set_round(id.round);
  response.set_fragment(id.fragment);
  response.set_contributors(uint32_t(frag.contributions.size()));
  if (ReadyLocked(frag, now)) CommitLocked(id.fragment, now);
  return response;
}

absl::Status SyncServer::CheckAsyncLocked(const Fragment& f, uint32_t fragment,
                                          const std::string& island, uint64_t base) const {
  if (auto s = membership_.CheckMember(island); !s.ok()) return s;
  if (base > f.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", base, " of fragment ", fragment, " is unknown; the current version is ",
        f.round, ": fetch the global state and continue"));
  }
  if (f.round - base > options_.max_staleness) {
    return absl::FailedPreconditionError(absl::StrCat(
        "contribution from version ", base, " of fragment ", fragment, " is ", f.round - base,
        " versions stale (the bound is ", options_.max_staleness,
        "): fetch the global state and continue"));
  }
  if (auto it = f.last_base.find(island); it != f.last_base.end() && base <= it->second) {
    return absl::AlreadyExistsError(absl::StrCat("island '", island,
                                                 "' has already contributed from version ", base,
                                                 " of fragment ", fragment));
  }
  return absl::OkStatus();
}

uint32_t SyncServer::SyncEveryLocked(const std::string& island) const {
  if (!options_.dynamic_local_steps) return options_.sync_every;
  auto it = steps_per_s_.find(island);
  if (it == steps_per_s_.end()) return options_.sync_every;
  double v_max = 0;
  for (const auto& [id, v] : steps_per_s_) v_max = std::max(v_max, v);
  return DynamicLocalSteps(it->second, v_max, options_.sync_every);
}

absl::StatusOr<pb::PushResponse> SyncServer::ApplyAsyncLocked(const PayloadId& id,
                                                              Contribution c,
                                                              double steps_per_s) {
  Fragment& frag = fragments_[id.fragment];
  const uint64_t staleness = frag.round - id.round;
  std::vector<float> g(frag.params.size());
  if (auto s = c.payload.Read(0, g.size(), g.data()); !s.ok()) return s;
  if (options_.staleness_scaling && staleness > 0) {
    const float scale = float(1.0 / double(1 + staleness));
    for (float& v : g) v *= scale;
  }
  RoundRecord record;
  record.contributors = {id.island_id};
  record.tokens = c.tokens;
  record.staleness = staleness;
  record.relative_norms[id.island_id] = frag.params_norm > 0 ? c.norm / frag.params_norm : 0.0;
  if (auto s = ApplyLocked(id.fragment, g, std::move(record), absl::Now()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("contribution of island '", id.island_id,
                                                   "' refused: ", s.message()));
  }
  frag.last_base[id.island_id] = id.round;
  membership_.Contributed(id.island_id, absl::Now()).IgnoreError();  // a member: checked
  if (steps_per_s > 0) steps_per_s_[id.island_id] = steps_per_s;
  if (id.fragment == 0) tokens_committed_ += c.tokens;
  pb::PushResponse response;
  response.set_round(id.round);
  response.set_fragment(id.fragment);
  response.set_contributors(1);
  response.set_version(frag.round);
  response.set_staleness(uint32_t(staleness));
  response.set_sync_every(SyncEveryLocked(id.island_id));
  response.set_tokens_committed(tokens_committed_);
  response.set_budget_reached(options_.token_budget > 0 &&
                              tokens_committed_ >= options_.token_budget);
  return response;
}

}  // namespace atl::outer
