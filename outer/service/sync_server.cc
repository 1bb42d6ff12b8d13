#include "outer/service/sync_server.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "outer/base/aggregation.h"
#include "outer/base/names.h"
#include "outer/service/sync_server_internal.h"

namespace atl::outer {

uint32_t DynamicLocalSteps(double v, double v_max, uint32_t h) {
  if (!(v > 0) || !(v_max > 0) || v >= v_max) return h;
  return std::max<uint32_t>(1, uint32_t(std::floor(v / v_max * double(h))));
}

bool ShardOwns(const SyncServerOptions& options, uint32_t fragment) {
  return options.num_shards <= 1 ||
         (options.shard >= 0 && fragment % options.num_shards == uint32_t(options.shard));
}

namespace {

std::string ShardName(const SyncServerOptions& o) {
  if (o.num_shards <= 1) return "the service";
  if (o.shard == SyncServerOptions::kControlPlane) return "the coordinator";
  return absl::StrCat("shard ", o.shard, " of ", o.num_shards);
}

}  // namespace

uint64_t FragmentLayout::total() const {
  return std::accumulate(numels.begin(), numels.end(), uint64_t(0));
}

SyncServer::Fragment::Fragment(FragmentLayout l, std::vector<float> p, const OuterOptimizerConfig& o)
    : layout(std::move(l)),
      data_mu(std::make_unique<std::mutex>()),
      data(std::move(p), o),
      params_hash(data.Hash()),
      params_norm(data.Norm(nullptr)) {}

SyncServer::SyncServer(SyncServerOptions options, FragmentLayout layout, std::vector<float> initial)
    : options_(std::move(options)),
      pool_(std::make_unique<WorkerPool>(options_.service_threads)),
      membership_(options_.num_data_streams, absl::Seconds(options_.lease_s)) {
  fragments_.emplace_back(std::move(layout), std::move(initial), options_.optimizer);
  StartTuner();
}

SyncServer::SyncServer(SyncServerOptions options, std::vector<FragmentLayout> layouts,
                       std::vector<std::vector<float>> initial)
    : options_(std::move(options)),
      pool_(std::make_unique<WorkerPool>(options_.service_threads)),
      membership_(options_.num_data_streams, absl::Seconds(options_.lease_s)) {
  for (size_t f = 0; f < layouts.size(); ++f) {
    // A sharded service keeps the data of its own fragments only.
    if (!ShardOwns(options_, uint32_t(f))) initial[f] = {};
    fragments_.emplace_back(std::move(layouts[f]), std::move(initial[f]), options_.optimizer);
  }
  if (is_control_plane()) shard_addresses_.resize(options_.num_shards);
  StartTuner();
}

void SyncServer::Renew(const std::string& island) {
  std::lock_guard<std::mutex> lock(mu_);
  membership_.Heartbeat(island, absl::Now()).IgnoreError();
}

void SyncServer::StartTuner() {
  if (!(options_.auto_tune_target > 0) || options_.async) return;
  PlanInput run;
  for (const auto& f : fragments_) run.fragment_elements.push_back(f.layout.total());
  run.method = PlanMethod::kStreaming;
  run.sync_every = int(options_.sync_every);
  run.codec = options_.codec;
  run.islands = int(options_.num_data_streams);
  tuner_ = std::make_unique<TauTuner>(std::move(run), options_.auto_tune_target,
                                      options_.auto_tune_headroom);
}

absl::StatusOr<uint32_t> SyncServer::CheckFragment(uint32_t fragment) const {
  if (fragment < fragments_.size() && !ShardOwns(options_, fragment)) {
    return absl::FailedPreconditionError(
        absl::StrCat("fragment ", fragment, " is served by shard ", fragment % options_.num_shards,
                     " of ", options_.num_shards, "; this is ", ShardName(options_)));
  }
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
  sched->set_warm_start_steps(uint64_t(options_.phases.warm_start_steps));
  sched->set_early_sync_every(uint32_t(options_.phases.early_sync_every));
  sched->set_early_sync_steps(uint64_t(options_.phases.early_sync_steps));
  sched->set_tokens_per_step(options_.tokens_per_step);
}

absl::Status SyncServer::CheckMembershipCall() const {
  if (!is_shard()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this is ", ShardName(options_), " of run '", options_.run_id,
      "': joins, heartbeats and leaves go to the run's coordinator"));
}

absl::StatusOr<pb::JoinResponse> SyncServer::Join(const pb::JoinRequest& request) {
  ATL_RETURN_IF_ERROR(CheckRun(request.run_id()));
  ATL_RETURN_IF_ERROR(CheckMembershipCall());
  if (request.config_hash() != options_.config_hash) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the island's [model] config differs from the run's (hash %016x, the run's %016x): both "
        "must build the same model",
        request.config_hash(), options_.config_hash));
  }
  const uint32_t data_parallel = std::max<uint32_t>(1, request.data_parallel());
  if (data_parallel > kMaxDataParallel) {
    return absl::InvalidArgumentError(absl::StrCat("the island declares ", data_parallel,
                                                   " data-parallel ranks; at most ",
                                                   kMaxDataParallel, " are taken"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t k = 0; k < shard_addresses_.size(); ++k) {
    if (shard_addresses_[k].empty()) {
      return absl::UnavailableError(absl::StrCat("the run's shard ", k, " of ",
                                                 options_.num_shards,
                                                 " has not reached the coordinator yet; retry"));
    }
  }
  std::vector<uint64_t> rounds;
  for (const auto& f : fragments_) rounds.push_back(f.round);
  // A proto3 int without presence: streams are numbered from 1 on the wire, 0 is "no preference".
  ATL_ASSIGN_OR_RETURN(auto joined,
                       membership_.Join(request.name(), int(request.preferred_data_stream()) - 1,
                                        rounds, absl::Now(), first_rounds_));
  joined.data_parallel = data_parallel;
  joined.resume_floor = ResumeFloorLocked();
  *membership_.FindMutable(joined.name) = joined;
  const Member& m = joined;
  complement_reached_ |= membership_.size() >= options_.num_data_streams;
  membership_cv_.notify_all();
  if (fragments_[0].round > 0) {
    MemberEventLocked(absl::StrCat("island '", m.name, "' joined"),
                      absl::StrCat(" at round ", fragments_[0].round, " (data stream ",
                                   m.data_stream, "); rounds wait for it from round ",
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
    if (ShardOwns(options_, f)) {
      frag->set_params_hash(fragments_[f].params_hash);
      frag->set_round(fragments_[f].round);
    }
  }
  for (const auto& address : shard_addresses_) r.add_shards(address);
  return r;
}

absl::Status SyncServer::Leave(const pb::LeaveRequest& request) {
  ATL_RETURN_IF_ERROR(CheckRun(request.run_id()));
  ATL_RETURN_IF_ERROR(CheckMembershipCall());
  std::vector<CommitJob> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ATL_RETURN_IF_ERROR(AuthenticateMemberLocked(request.island_id(), request.session()));
    ATL_RETURN_IF_ERROR(membership_.Leave(request.island_id()));
    membership_cv_.notify_all();
    ForgetIslandLocked(request.island_id());
    if (!AllDoneLocked()) {
      MemberEventLocked(absl::StrCat("island '", request.island_id(), "' left"),
                        absl::StrCat(" at round ", fragments_[0].round));
    }
    // Rounds may now be complete without the island that left.
    jobs = TakeReadyLocked(absl::Now());
  }
  RunCommits(std::move(jobs));
  return absl::OkStatus();
}

absl::StatusOr<pb::HeartbeatResponse> SyncServer::Heartbeat(const pb::HeartbeatRequest& request) {
  ATL_RETURN_IF_ERROR(CheckRun(request.run_id()));
  ATL_RETURN_IF_ERROR(CheckMembershipCall());
  std::lock_guard<std::mutex> lock(mu_);
  ATL_RETURN_IF_ERROR(AuthenticateMemberLocked(request.island_id(), request.session()));
  ATL_RETURN_IF_ERROR(ValidateTelemetry(request.telemetry()));
  ATL_RETURN_IF_ERROR(membership_.Heartbeat(request.island_id(), absl::Now()));
  Member* member = membership_.FindMutable(request.island_id());
  if (request.finished()) member->finished = true;
  member->inner_step = request.inner_step();
  member->telemetry = request.telemetry();
  member->peak_tokens_per_s = std::max(member->peak_tokens_per_s, request.telemetry().tokens_per_s());
  pb::HeartbeatResponse r;
  r.set_round(fragments_[0].round);
  r.set_membership_epoch(membership_.epoch());
  uint32_t training = 0;
  for (const auto& [id, m] : membership_.members()) training += m.finished ? 0 : 1;
  r.set_training_members(training);
  for (const auto& f : fragments_) r.add_versions(f.round);
  return r;
}

absl::Status ValidateTelemetry(const pb::IslandTelemetry& t) {
  const std::pair<const char*, std::pair<double, double>> bounds[] = {
      {"loss", {t.loss(), 1e4}},
      {"val_loss", {t.val_loss(), 1e4}},
      {"val_bpb", {t.val_bpb(), 1e4}},
      {"tokens_per_s", {t.tokens_per_s(), 1e12}},
      {"utilization", {t.utilization(), 1}}};
  for (const auto& [name, value_max] : bounds) {
    const auto [value, max] = value_max;
    if (!(value >= 0 && value <= max)) {  // NaN fails too
      return absl::InvalidArgumentError(
          absl::StrCat("heartbeat telemetry: ", name, " = ", value, " is not in [0, ", max, "]"));
    }
  }
  return absl::OkStatus();
}

SyncServer::Status SyncServer::GetStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  Status status;
  const absl::Time now = absl::Now();
  for (const auto& [id, m] : membership_.members()) {
    IslandStatus& i = status.islands.emplace_back();
    i.island_id = id;
    i.state = StateName(m.state);
    i.data_stream = m.data_stream;
    i.data_parallel = m.data_parallel;
    i.member = true;
    i.finished = m.finished;
    i.silent_s = absl::ToDoubleSeconds(now - m.last_seen);
    i.inner_step = m.inner_step;
    i.telemetry = m.telemetry;
    i.flagged_claims = m.flagged_claims;
  }
  for (const auto& [id, state] : membership_.departed_states()) {
    if (membership_.Find(id) != nullptr) continue;  // it joined again
    IslandStatus& i = status.islands.emplace_back();
    i.island_id = id;
    i.state = StateName(state);
  }
  for (const auto& f : fragments_) status.rounds.push_back(f.round);
  for (const auto& f : fragments_) status.committed_rounds += f.round;
  status.membership_epoch = membership_.epoch();
  status.lease_expiries = lease_expiries_;
  return status;
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

void SyncServer::ForgetIslandLocked(const std::string& island) {
  steps_per_s_.erase(island);
  if (tuner_) tuner_->Forget(island);
  for (auto& f : fragments_) {
    f.partials.erase(island);
    f.applied.erase(island);
  }
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

void SyncServer::Tick(absl::Time now) {
  std::vector<CommitJob> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (now >= complement_deadline_) complement_reached_ = true;
    // Islands silent past their lease are dropped; rounds that waited only for them commit now
    // with the contributions that arrived (weights renormalized over those).
    const auto expired = membership_.ExpireLeases(now);
    if (!expired.empty()) membership_cv_.notify_all();
    for (const auto& name : expired) {
      ForgetIslandLocked(name);
      ++lease_expiries_;
      MemberEventLocked(absl::StrCat("island '", name, "' declared dead"),
                        absl::StrCat(" after ", absl::FormatDuration(membership_.lease()),
                                     " of silence; rounds go on without it"));
    }
    if (on_event_) {
      for (const auto& line : event_limiter_.Flush(now)) on_event_(line);
    }
    jobs = TakeReadyLocked(now);
  }
  RunCommits(std::move(jobs));
}

void SyncServer::MemberEventLocked(const std::string& key, const std::string& rest) {
  if (on_event_ && event_limiter_.Allow(key, absl::Now())) on_event_(key + rest);
}

void SyncServer::SetCommitListener(std::function<void(const CommittedRound&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  on_commit_ = std::move(listener);
}

void SyncServer::SetEventListener(std::function<void(const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  on_event_ = std::move(listener);
}

bool SyncServer::KnowsIsland(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_.Find(name) != nullptr || membership_.departed_states().count(name) > 0;
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
  const Fragment& f = fragments_.at(fragment);
  std::lock_guard<std::mutex> lock(*f.data_mu);
  return f.data.params();
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

absl::StatusOr<pb::ShardSyncResponse> SyncServer::ShardSync(const pb::ShardSyncRequest& request,
                                                             absl::Time deadline) {
  ATL_RETURN_IF_ERROR(CheckRun(request.run_id()));
  if (!is_control_plane()) {
    return absl::FailedPreconditionError(
        is_shard() ? absl::StrCat("this is ", ShardName(options_), ", not the run's coordinator")
                   : absl::StrCat("run '", options_.run_id,
                                  "' is not sharded (outer.shards = 1 at its coordinator)"));
  }
  if (request.config_hash() != options_.config_hash) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shard %d was started with another model config (hash %016x, the run's "
                        "%016x)", request.shard(), request.config_hash(), options_.config_hash));
  }
  if (request.num_shards() != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a shard of ", request.num_shards(), " called; the run has ", options_.num_shards, " shards"));
  }
  const uint32_t k = request.shard();
  if (k >= options_.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", k, " of ", options_.num_shards, "?"));
  }
  if (request.address().empty() || request.address().size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", k, " gave no address (or a too long one)"));
  }
  std::vector<uint32_t> owned;
  for (uint32_t f = k; f < fragments_.size(); f += options_.num_shards) owned.push_back(f);
  if (size_t(request.rounds_size()) != owned.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", k, " reported ", request.rounds_size(),
                                                   " rounds for its ", owned.size(), " fragments"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (shard_addresses_[k] != request.address() && on_event_) {
    on_event_(absl::StrCat("shard ", k, " of ", options_.num_shards, " serves fragments ",
                           absl::StrJoin(owned, ","), " at ", request.address()));
  }
  shard_addresses_[k] = request.address();
  for (size_t i = 0; i < owned.size(); ++i) fragments_[owned[i]].round = request.rounds(int(i));
  const absl::Time now = absl::Now();
  for (const auto& island : request.heard()) membership_.Contributed(island, now).IgnoreError();
  membership_cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] {
    return membership_.epoch() != request.known_epoch();
  });
  pb::ShardSyncResponse view;
  membership_.FillView(&view);
  view.set_complement_reached(complement_reached_);
  return view;
}

pb::ShardSyncRequest SyncServer::ShardReport(const std::string& address) {
  pb::ShardSyncRequest r;
  r.set_run_id(options_.run_id);
  r.set_shard(uint32_t(std::max(0, options_.shard)));
  r.set_num_shards(options_.num_shards);
  r.set_address(address);
  r.set_config_hash(options_.config_hash);
  std::lock_guard<std::mutex> lock(mu_);
  r.set_known_epoch(membership_.mirror() ? membership_.epoch() : 0);
  for (uint32_t f = 0; f < fragments_.size(); ++f) {
    if (ShardOwns(options_, f)) r.add_rounds(fragments_[f].round);
  }
  uint64_t committed = 0;
  for (const auto& f : fragments_) committed += f.round;
  r.set_committed_rounds(committed);
  for (auto& island : membership_.TakeHeard()) r.add_heard(std::move(island));
  return r;
}

void SyncServer::MirrorMembership(const pb::ShardSyncResponse& view) {
  std::vector<CommitJob> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<uint64_t> rounds;
    for (const auto& f : fragments_) rounds.push_back(f.round);
    for (const auto& name : membership_.Mirror(view, rounds, absl::Now(), first_rounds_)) {
      ForgetIslandLocked(name);
    }
    for (const auto& [name, m] : membership_.members()) {
      if (m.resume_floor < 0) membership_.FindMutable(name)->resume_floor = ResumeFloorLocked();
    }
    complement_reached_ = view.complement_reached();
    // Rounds may now be complete without the islands that left.
    jobs = TakeReadyLocked(absl::Now());
  }
  RunCommits(std::move(jobs));
}

}  // namespace atl::outer
