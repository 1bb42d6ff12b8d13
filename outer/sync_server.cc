#include "outer/sync_server.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/checksum.h"

namespace atl::outer {
namespace {

constexpr size_t kCommittedKept = 8;

uint64_t HashParams(const std::vector<float>& p) {
  return compression::Checksum(p.data(), p.size() * sizeof(float));
}

}  // namespace

uint64_t FragmentLayout::total() const {
  return std::accumulate(numels.begin(), numels.end(), uint64_t(0));
}

SyncServer::Fragment::Fragment(FragmentLayout l, std::vector<float> p, const OuterOptimizerConfig& o)
    : layout(std::move(l)),
      params(std::move(p)),
      params_hash(HashParams(params)),
      optimizer(o, params.size()) {}

SyncServer::SyncServer(SyncServerOptions options, FragmentLayout layout, std::vector<float> initial)
    : options_(std::move(options)) {
  fragments_.emplace_back(std::move(layout), std::move(initial), options_.optimizer);
}

SyncServer::SyncServer(SyncServerOptions options, std::vector<FragmentLayout> layouts,
                       std::vector<std::vector<float>> initial)
    : options_(std::move(options)) {
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
  return absl::NotFoundError(absl::StrCat("unknown run '", run_id, "' (this service runs '",
                                          options_.run_id, "')"));
}

absl::StatusOr<pb::JoinResponse> SyncServer::Join(const pb::JoinRequest& request) {
  if (auto s = CheckRun(request.run_id()); !s.ok()) return s;
  if (request.name().empty()) return absl::InvalidArgumentError("an island needs a name");
  std::lock_guard<std::mutex> lock(mu_);
  if (members_.count(request.name())) {
    return absl::AlreadyExistsError(
        absl::StrCat("an island named '", request.name(), "' is already a member"));
  }
  std::vector<bool> taken(options_.num_data_streams, false);
  for (const auto& [id, m] : members_) taken[m.data_stream] = true;
  const auto free = std::find(taken.begin(), taken.end(), false);
  if (free == taken.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", options_.num_data_streams, " data streams are taken by current members"));
  }
  Member m{request.name(), uint32_t(free - taken.begin()), absl::Now()};
  members_[request.name()] = m;
  ++membership_epoch_;

  pb::JoinResponse r;
  r.set_island_id(request.name());
  r.set_data_stream(m.data_stream);
  r.set_round(fragments_[0].round);
  auto* sched = r.mutable_schedule();
  sched->set_sync_every(options_.sync_every);
  sched->set_num_fragments(uint32_t(fragments_.size()));
  sched->set_num_data_streams(options_.num_data_streams);
  sched->set_total_inner_steps(options_.total_inner_steps);
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
  if (members_.erase(request.island_id()) == 0) {
    return absl::NotFoundError(absl::StrCat("island '", request.island_id(), "' is not a member"));
  }
  ++membership_epoch_;
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
  auto it = members_.find(request.island_id());
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("island '", request.island_id(), "' is not a member"));
  }
  it->second.last_seen = absl::Now();
  pb::HeartbeatResponse r;
  r.set_round(fragments_[0].round);
  r.set_membership_epoch(membership_epoch_);
  return r;
}

pb::GetStateResponse SyncServer::GetState() const {
  std::lock_guard<std::mutex> lock(mu_);
  pb::GetStateResponse r;
  r.set_round(fragments_[0].round);
  r.set_membership_epoch(membership_epoch_);
  for (const auto& [id, m] : members_) {
    auto* i = r.add_islands();
    i->set_island_id(id);
    i->set_name(m.name);
    i->set_data_stream(m.data_stream);
    i->set_state("active");
  }
  auto* sched = r.mutable_schedule();
  sched->set_sync_every(options_.sync_every);
  sched->set_num_fragments(uint32_t(fragments_.size()));
  sched->set_num_data_streams(options_.num_data_streams);
  sched->set_total_inner_steps(options_.total_inner_steps);
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

absl::StatusOr<pb::PushResponse> SyncServer::Push(const std::vector<pb::PushRequest>& requests) {
  if (requests.empty()) return absl::InvalidArgumentError("empty push: no chunks");
  const auto& first = requests.front().chunk().header();
  if (auto s = CheckRun(first.run_id()); !s.ok()) return s;
  auto fid = CheckFragment(first.fragment());
  if (!fid.ok()) return fid.status();
  Fragment& frag = fragments_[*fid];
  const std::string island = first.island_id();
  const uint64_t round = first.round();
  {
    // Cheap checks before decoding anything.
    std::lock_guard<std::mutex> lock(mu_);
    if (!members_.count(island)) {
      return absl::PermissionDeniedError(
          absl::StrCat("island '", island, "' is not a member of run '", options_.run_id, "'"));
    }
    if (round != frag.round) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", round, " of fragment ", *fid,
          round < frag.round ? " has already committed" : " is unknown", "; the current round is ",
          frag.round, ": fetch the global state and continue"));
    }
    if (frag.contributions.count(island)) {
      return absl::AlreadyExistsError(
          absl::StrCat("island '", island, "' has already contributed to round ", round));
    }
  }
  const uint64_t total = frag.layout.total();
  Assembler assembler({options_.run_id, island, round, *fid}, total, 0, total, options_.codec);
  for (const auto& r : requests) {
    if (auto s = assembler.Add(r.chunk()); !s.ok()) return s;
  }
  if (auto s = assembler.CheckComplete(); !s.ok()) return s;
  const uint64_t tokens = requests.front().tokens();
  if (tokens == 0) return absl::InvalidArgumentError("a contribution must weigh at least 1 token");

  std::lock_guard<std::mutex> lock(mu_);
  // The state may have moved while we decoded.
  if (round != frag.round) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round, " of fragment ", *fid,
                                                      " committed while the payload arrived; "
                                                      "fetch the global state and continue"));
  }
  if (!members_.count(island)) {
    return absl::PermissionDeniedError(absl::StrCat("island '", island, "' is no longer a member"));
  }
  if (!frag.contributions
           .emplace(island, Contribution{std::move(assembler.mutable_values()), tokens})
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("island '", island, "' has already contributed to round ", round));
  }
  const absl::Time now = absl::Now();
  if (frag.contributions.size() == 1) {
    frag.deadline = now + absl::Seconds(options_.round_timeout_s);
  }
  pb::PushResponse response;
  response.set_round(round);
  response.set_fragment(*fid);
  response.set_contributors(uint32_t(frag.contributions.size()));
  if (ReadyLocked(frag, now)) CommitLocked(*fid, now);
  return response;
}

bool SyncServer::ReadyLocked(const Fragment& f, absl::Time now) const {
  if (f.contributions.empty()) return false;
  // Before its deadline a round needs every member; the first round also waits for the run's full
  // complement of islands, so an island that is merely slower to start takes part from the start.
  bool all = f.round > 0 || members_.size() >= options_.num_data_streams;
  for (const auto& [id, m] : members_) all &= f.contributions.count(id) > 0;
  if (all) return true;
  return now >= f.deadline && int(f.contributions.size()) >= options_.min_islands;
}

void SyncServer::CommitLocked(uint32_t fragment, absl::Time now) {
  Fragment& f = fragments_[fragment];
  const size_t n = f.params.size();
  auto committed = std::make_shared<CommittedRound>();
  committed->round = f.round;
  // Weighted mean in double, in island-id order (std::map): independent of arrival order.
  std::vector<double> sum(n, 0.0);
  double total = 0;
  for (const auto& [id, c] : f.contributions) {
    const double w = double(c.tokens);
    for (size_t i = 0; i < n; ++i) sum[i] += w * double(c.delta[i]);
    total += w;
    committed->contributors.push_back(id);
    committed->tokens += c.tokens;
  }
  std::vector<float> mean(n);
  for (size_t i = 0; i < n; ++i) mean[i] = float(sum[i] / total);
  // The update every copy applies is the decoded encoding of the optimizer's update, so the
  // service and the islands subtract exactly the same numbers.
  std::vector<float> update(n);
  f.optimizer.ComputeUpdate(mean.data(), update.data());
  const PayloadId id{options_.run_id, "", f.round, fragment};
  auto chunks = EncodeChunks(id, options_.codec, update.data(), 0, n, n, options_.chunk_bytes);
  // The update is a finite combination of verified finite inputs; an overflow to infinity would
  // make every island diverge, so it is a bug worth stopping for.
  if (!chunks.ok()) std::abort();
  Assembler decoded(id, n, 0, n, options_.codec);
  for (const auto& c : *chunks) {
    if (!decoded.Add(c).ok()) std::abort();
  }
  committed->update = std::move(decoded.mutable_values());
  ApplyUpdate(f.params.data(), committed->update.data(), n);
  f.params_hash = HashParams(f.params);
  committed->params_hash = f.params_hash;
  committed->commit_unix_s = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  committed->update_chunks = *std::move(chunks);
  committed->fragment = fragment;
  if (on_commit_) on_commit_(*committed);
  f.committed.push_back(std::move(committed));
  while (f.committed.size() > kCommittedKept) f.committed.pop_front();
  f.contributions.clear();
  f.deadline = absl::InfiniteFuture();
  ++f.round;
  committed_cv_.notify_all();
}

absl::StatusOr<std::shared_ptr<const CommittedRound>> SyncServer::AwaitRound(uint64_t round,
                                                                             absl::Time deadline,
                                                                             uint32_t fragment) {
  auto fid = CheckFragment(fragment);
  if (!fid.ok()) return fid.status();
  std::unique_lock<std::mutex> lock(mu_);
  Fragment& f = fragments_[*fid];
  if (round > f.round) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round, " of fragment ", *fid,
                                                      " is unknown; the current round is ", f.round));
  }
  const auto until = absl::ToChronoTime(deadline);
  while (f.round <= round) {
    if (committed_cv_.wait_until(lock, until) == std::cv_status::timeout && f.round <= round) {
      return absl::DeadlineExceededError(absl::StrCat("round ", round, " of fragment ", *fid,
                                                      " has not committed yet"));
    }
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
  for (uint32_t f = 0; f < fragments_.size(); ++f) {
    if (ReadyLocked(fragments_[f], now)) CommitLocked(f, now);
  }
}

void SyncServer::SetCommitListener(std::function<void(const CommittedRound&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  on_commit_ = std::move(listener);
}

size_t SyncServer::num_members() const {
  std::lock_guard<std::mutex> lock(mu_);
  return members_.size();
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

uint64_t SyncServer::committed_rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& f : fragments_) n += f.round;
  return n;
}

}  // namespace atl::outer
