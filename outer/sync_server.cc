#include "outer/sync_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/checksum.h"
#include "outer/aggregation.h"
#include "outer/names.h"

namespace atl::outer {
namespace {

constexpr size_t kCommittedKept = 8;

uint64_t HashParams(const std::vector<float>& p) {
  return compression::Checksum(p.data(), p.size() * sizeof(float));
}

double Norm(const std::vector<float>& p) {
  double sum = 0;
  for (float v : p) sum += double(v) * double(v);
  return std::sqrt(sum);
}

}  // namespace

uint32_t DynamicLocalSteps(double v, double v_max, uint32_t h) {
  if (!(v > 0) || !(v_max > 0) || v >= v_max) return h;
  return std::max<uint32_t>(1, uint32_t(std::floor(v / v_max * double(h))));
}

uint64_t FragmentLayout::total() const {
  return std::accumulate(numels.begin(), numels.end(), uint64_t(0));
}

SyncServer::Fragment::Fragment(FragmentLayout l, std::vector<float> p, const OuterOptimizerConfig& o)
    : layout(std::move(l)),
      params(std::move(p)),
      params_hash(HashParams(params)),
      params_norm(Norm(params)),
      optimizer(o, params.size()) {}

SyncServer::SyncServer(SyncServerOptions options, FragmentLayout layout, std::vector<float> initial)
    : options_(std::move(options)),
      membership_(options_.num_data_streams, absl::Seconds(options_.lease_s)) {
  fragments_.emplace_back(std::move(layout), std::move(initial), options_.optimizer);
}

SyncServer::SyncServer(SyncServerOptions options, std::vector<FragmentLayout> layouts,
                       std::vector<std::vector<float>> initial)
    : options_(std::move(options)),
      membership_(options_.num_data_streams, absl::Seconds(options_.lease_s)) {
  for (size_t f = 0; f < layouts.size(); ++f) {
    fragments_.emplace_back(std::move(layouts[f]), std::move(initial[f]), options_.optimizer);
  }
}

absl::StatusOr<uint32_t> SyncServer::CheckFragment(uint32_t fragment) const {
  if (fragment < fragments_.size()) return fragment;
  return absl::NotFoundError(absl::StrCat("unknown fragment ", fragment, " (this run has ",
                                          fragments_.size(), " fragment",
                                          fragments_.size() == 1 ? "" : "s", ")"));
}

absl::Status SyncServer::CheckRun(const std::string& run_id) const {
  if (run_id == options_.run_id) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("unknown run ", Printable(run_id), " (this service runs '",
                                          options_.run_id, "')"));
}

void SyncServer::FillSchedule(pb::OuterSchedule* sched) const {
  sched->set_sync_every(options_.sync_every);
  sched->set_num_fragments(uint32_t(fragments_.size()));
  sched->set_num_data_streams(options_.num_data_streams);
  sched->set_total_inner_steps(options_.total_inner_steps);
  sched->set_async(options_.async);
  sched->set_token_budget(options_.token_budget);
}

absl::StatusOr<pb::JoinResponse> SyncServer::Join(const pb::JoinRequest& request) {
  if (auto s = CheckRun(request.run_id()); !s.ok()) return s;
  if (request.config_hash() != options_.config_hash) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the island's [model] config differs from the run's (hash %016x, the run's %016x): both "
        "must build the same model",
        request.config_hash(), options_.config_hash));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> rounds;
  for (const auto& f : fragments_) rounds.push_back(f.round);
  // A proto3 int without presence: streams are numbered from 1 on the wire, 0 is "no preference".
  auto joined = membership_.Join(request.name(), int(request.preferred_data_stream()) - 1, rounds,
                                 absl::Now(), first_rounds_);
  if (!joined.ok()) return joined.status();
  const Member& m = *joined;
  complement_reached_ |= membership_.size() >= options_.num_data_streams;
  if (on_event_ && fragments_[0].round > 0) {
    on_event_(absl::StrCat("island '", m.name, "' joined at round ", fragments_[0].round,
                           " (data stream ", m.data_stream, "); rounds wait for it from round ",
                           m.required_from[0], " on"));
  }

  pb::JoinResponse r;
  r.set_island_id(request.name());
  r.set_session(m.session);
  r.set_data_stream(m.data_stream);
  r.set_round(fragments_[0].round);
  FillSchedule(r.mutable_schedule());
  r.set_config_hash(options_.config_hash);
  for (uint32_t f = 0; f < fragments_.size(); ++f) {
    auto* frag = r.add_fragments();
    frag->set_fragment(f);
    for (const auto& n : fragments_[f].layout.names) frag->add_parameters(n);
    frag->set_num_elements(fragments_[f].layout.total());
  }
  return r;
}

absl::Status SyncServer::Leave(const pb::LeaveRequest& request) {
  if (auto s = CheckRun(request.run_id()); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto s = AuthenticateMemberLocked(request.island_id(), request.session()); !s.ok()) return s;
  if (auto s = membership_.Leave(request.island_id()); !s.ok()) return s;
  steps_per_s_.erase(request.island_id());
  if (on_event_ && !AllDoneLocked()) {
    on_event_(absl::StrCat("island '", request.island_id(), "' left at round ", fragments_[0].round));
  }
  // Rounds may now be complete without the island that left.
  const absl::Time now = absl::Now();
  for (uint32_t f = 0; f < fragments_.size(); ++f) {
    if (ReadyLocked(fragments_[f], now)) CommitLocked(f, now);
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::HeartbeatResponse> SyncServer::Heartbeat(const pb::HeartbeatRequest& request) {
  if (auto s = CheckRun(request.run_id()); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto s = AuthenticateMemberLocked(request.island_id(), request.session()); !s.ok()) return s;
  if (auto s = membership_.Heartbeat(request.island_id(), absl::Now()); !s.ok()) return s;
  if (request.finished()) membership_.FindMutable(request.island_id())->finished = true;
  pb::HeartbeatResponse r;
  r.set_round(fragments_[0].round);
  r.set_membership_epoch(membership_.epoch());
  uint32_t training = 0;
  for (const auto& [id, m] : membership_.members()) training += m.finished ? 0 : 1;
  r.set_training_members(training);
  for (const auto& f : fragments_) r.add_versions(f.round);
  return r;
}

pb::GetStateResponse SyncServer::GetState() const {
  std::lock_guard<std::mutex> lock(mu_);
  pb::GetStateResponse r;
  r.set_round(fragments_[0].round);
  r.set_membership_epoch(membership_.epoch());
  for (const auto& [id, m] : membership_.members()) {
    auto* i = r.add_islands();
    i->set_island_id(id);
    i->set_name(m.name);
    i->set_data_stream(m.data_stream);
    i->set_state(StateName(m.state));
  }
  FillSchedule(r.mutable_schedule());
  const auto& committed = fragments_[0].committed;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    auto* s = r.add_committed();
    s->set_round((*it)->round);
    for (const auto& c : (*it)->contributors) s->add_contributors(c);
    s->set_tokens((*it)->tokens);
    s->set_params_hash((*it)->params_hash);
    s->set_commit_unix_s((*it)->commit_unix_s);
  }
  return r;
}

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

absl::Status SyncServer::Authenticate(const std::string& island, const std::string& session) const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_.Authenticate(island, session);
}

absl::Status SyncServer::AuthenticateMemberLocked(const std::string& island,
                                                  const std::string& session) const {
  // Non-members get the caller's usual NOT_FOUND (which tells a dropped island to rejoin).
  if (membership_.Find(island) == nullptr) return absl::OkStatus();
  return membership_.Authenticate(island, session);
}

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
  std::vector<float> snapshot;
  uint64_t round, hash;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto s = membership_.Authenticate(request.island_id(), request.session()); !s.ok()) {
      return s;
    }
    snapshot = fragments_[*fid].params;
    round = fragments_[*fid].round;
    hash = fragments_[*fid].params_hash;
  }
  const uint64_t total = snapshot.size();
  if (request.offset() > total) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", request.offset(), " is past the fragment's ", total, " elements"));
  }
  const uint64_t n = request.num_elements() == 0
                         ? total - request.offset()
                         : std::min<uint64_t>(request.num_elements(), total - request.offset());
  auto chunks = EncodeChunks({options_.run_id, "", round, *fid}, {compression::Codec::kFp32, 0},
                             snapshot.data() + request.offset(), request.offset(), n, total,
                             options_.chunk_bytes);
  if (!chunks.ok()) return chunks.status();
  std::vector<pb::StateChunk> out;
  out.reserve(chunks->size());
  for (auto& c : *chunks) {
    pb::StateChunk s;
    *s.mutable_chunk() = std::move(c);
    s.set_params_hash(hash);
    out.push_back(std::move(s));
  }
  return out;
}

void SyncServer::Tick(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (now >= complement_deadline_) complement_reached_ = true;
  // Islands silent past their lease are dropped; rounds that waited only for them commit now
  // with the contributions that arrived (weights renormalized over those).
  for (const auto& name : membership_.ExpireLeases(now)) {
    steps_per_s_.erase(name);
    if (on_event_) on_event_(absl::StrCat("island '", name, "' declared dead after ",
                                          absl::FormatDuration(membership_.lease()),
                                          " of silence; rounds go on without it"));
  }
  for (uint32_t f = 0; f < fragments_.size(); ++f) {
    if (ReadyLocked(fragments_[f], now)) CommitLocked(f, now);
  }
}

namespace {

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

absl::StatusOr<std::vector<float>> FloatsOf(const std::string& bytes, size_t expected,
                                            const char* what, uint32_t fragment) {
  if (bytes.size() != expected * sizeof(float)) {
    return absl::DataLossError(absl::StrCat("service state: fragment ", fragment, " ", what, " has ",
                                            bytes.size(), " bytes, expected ",
                                            expected * sizeof(float)));
  }
  std::vector<float> v(expected);
  if (!bytes.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace

pb::ServiceState SyncServer::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  pb::ServiceState s;
  s.set_run_id(options_.run_id);
  s.set_config_hash(options_.config_hash);
  s.set_membership_epoch(membership_.epoch());
  s.set_tokens_committed(tokens_committed_);
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    const Fragment& f = fragments_[i];
    auto* fs = s.add_fragments();
    fs->set_fragment(i);
    fs->set_round(f.round);
    fs->set_params_hash(f.params_hash);
    fs->set_num_elements(f.params.size());
    fs->set_params(FloatBytes(f.params));
    fs->set_momentum(FloatBytes(f.optimizer.momentum()));
    fs->set_momentum_buffer(FloatBytes(f.optimizer.buffer()));
    fs->set_buffered(uint32_t(f.optimizer.buffered()));
  }
  s.set_written_unix_s(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return s;
}

absl::Status SyncServer::Restore(const pb::ServiceState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state.run_id() != options_.run_id) {
    return absl::FailedPreconditionError(absl::StrCat("service state is of run '", state.run_id(),
                                                      "', not '", options_.run_id, "'"));
  }
  if (state.config_hash() != options_.config_hash) {
    return absl::FailedPreconditionError("service state was written for another model config");
  }
  if (state.fragments_size() != int(fragments_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("service state has ", state.fragments_size(),
                                                      " fragments, this run ", fragments_.size()));
  }
  if (membership_.size() > 0) {
    return absl::FailedPreconditionError("service state must be restored before islands join");
  }
  // Check everything, then change anything.
  std::vector<OuterOptimizer> optimizers;
  std::vector<std::vector<float>> params;
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    const auto& fs = state.fragments(int(i));
    const size_t n = fragments_[i].params.size();
    auto p = FloatsOf(fs.params(), n, "parameters", i);
    if (!p.ok()) return p.status();
    if (HashParams(*p) != fs.params_hash()) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i,
                                              " parameters do not match their hash"));
    }
    OuterOptimizer opt(options_.optimizer, n);
    auto m = FloatsOf(fs.momentum(), opt.momentum().size(), "momentum", i);
    if (!m.ok()) return m.status();
    auto b = FloatsOf(fs.momentum_buffer(), opt.buffer().size(), "momentum buffer", i);
    if (!b.ok()) return b.status();
    if (auto s = opt.Restore(*std::move(m), *std::move(b), int(fs.buffered())); !s.ok()) {
      return absl::DataLossError(absl::StrCat("service state: fragment ", i, ": ", s.message()));
    }
    optimizers.push_back(std::move(opt));
    params.push_back(*std::move(p));
  }
  for (uint32_t i = 0; i < fragments_.size(); ++i) {
    Fragment& f = fragments_[i];
    f.params = std::move(params[i]);
    f.params_hash = state.fragments(int(i)).params_hash();
    f.params_norm = Norm(f.params);
    f.optimizer = std::move(optimizers[i]);
    f.round = state.fragments(int(i)).round();
    f.durable_round = f.round;
    f.committed.clear();
    f.contributions.clear();
    f.last_base.clear();
  }
  tokens_committed_ = state.tokens_committed();
  // The round open at the resume is a first round again: it waits for the islands that come back
  // (each is waited for in it), for their full complement or, at most, a grace period.
  first_rounds_.clear();
  for (const auto& f : fragments_) first_rounds_.push_back(f.round);
  complement_reached_ = false;
  complement_deadline_ =
      absl::Now() + std::max(absl::Seconds(10), 2 * absl::Seconds(options_.lease_s));
  return absl::OkStatus();
}

void SyncServer::SetDurabilityGate(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  durability_gate_ = on;
}

void SyncServer::MarkDurable(const pb::ServiceState& written) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& fs : written.fragments()) {
    if (fs.fragment() < fragments_.size()) {
      Fragment& f = fragments_[fs.fragment()];
      f.durable_round = std::max(f.durable_round, fs.round());
    }
  }
  committed_cv_.notify_all();
}

void SyncServer::SetCommitListener(std::function<void(const CommittedRound&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  on_commit_ = std::move(listener);
}

void SyncServer::SetEventListener(std::function<void(const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  on_event_ = std::move(listener);
}

size_t SyncServer::num_members() const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_.size();
}

uint64_t SyncServer::round(uint32_t fragment) const {
  std::lock_guard<std::mutex> lock(mu_);
  return fragments_.at(fragment).round;
}

uint64_t SyncServer::params_hash(uint32_t fragment) const {
  std::lock_guard<std::mutex> lock(mu_);
  return fragments_.at(fragment).params_hash;
}

std::vector<float> SyncServer::params(uint32_t fragment) const {
  std::lock_guard<std::mutex> lock(mu_);
  return fragments_.at(fragment).params;
}

bool SyncServer::budget_reached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.token_budget > 0 && tokens_committed_ >= options_.token_budget;
}

uint64_t SyncServer::committed_rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& f : fragments_) n += f.round;
  return n;
}

}  // namespace atl::outer
