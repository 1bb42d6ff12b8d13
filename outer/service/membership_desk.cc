#include "outer/service/membership_desk.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "outer/base/names.h"

namespace atl::outer {

absl::Status MembershipDesk::CheckMembershipCall() const {
  if (!core_.is_shard()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this is ", ShardName(core_.options), " of run '", core_.options.run_id,
                   "': joins, heartbeats and leaves go to the run's coordinator"));
}

// Where an island's parameters (JoinRequest.parameters) differ from the run's, by name: "; the
// run's parameter 'h.0.w' has 4096 elements, the island's 2048" (empty: none were sent).
std::string MembershipDesk::LayoutDifference(const pb::JoinRequest& request) const {
  if (request.parameters_size() == 0) return "";
  std::map<std::string, uint64_t> mine;
  for (const auto& p : request.parameters()) mine.emplace(p.name(), p.numel());
  size_t known = 0;
  for (const auto& fragment : core_.fragments) {
    for (size_t i = 0; i < fragment.layout.names.size(); ++i) {
      const std::string& name = fragment.layout.names[i];
      const uint64_t numel = fragment.layout.numels[i];
      auto it = mine.find(name);
      if (it == mine.end()) {
        return absl::StrFormat("; the run's parameter %s (%d elements) is not the island's",
                               outer::Printable(name, 256), numel);
      }
      if (it->second != numel) {
        return absl::StrFormat("; the run's parameter %s has %d elements, the island's %d",
                               outer::Printable(name, 256), numel, it->second);
      }
      ++known;
    }
  }
  if (known != mine.size()) {
    return absl::StrFormat("; the island has %d parameters the run does not", mine.size() - known);
  }
  return "; the parameters' names and sizes agree: a shape or another setting differs";
}

absl::StatusOr<pb::JoinResponse> MembershipDesk::Join(const pb::JoinRequest& request) {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  ATL_RETURN_IF_ERROR(CheckMembershipCall());
  if (request.config_hash() != core_.options.config_hash) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the island's [model] config differs from the run's (hash %016x, the run's %016x): both "
        "must build the same model%s",
        request.config_hash(), core_.options.config_hash, LayoutDifference(request)));
  }
  const uint32_t data_parallel = std::max<uint32_t>(1, request.data_parallel());
  if (data_parallel > kMaxDataParallel) {
    return absl::InvalidArgumentError(absl::StrCat("the island declares ", data_parallel,
                                                   " data-parallel ranks; at most ",
                                                   kMaxDataParallel, " are taken"));
  }
  std::lock_guard<std::mutex> lock(core_.mu);
  for (uint32_t k = 0; k < core_.shard_addresses.size(); ++k) {
    if (core_.shard_addresses[k].empty()) {
      return absl::UnavailableError(absl::StrCat("the run's shard ", k, " of ",
                                                 core_.options.num_shards,
                                                 " has not reached the coordinator yet; retry"));
    }
  }
  std::vector<uint64_t> rounds;
  for (const auto& f : core_.fragments) rounds.push_back(f.round);
  // A proto3 int without presence: streams are numbered from 1 on the wire, 0 is "no preference".
  ATL_ASSIGN_OR_RETURN(
      auto joined, core_.membership.Join(request.name(), int(request.preferred_data_stream()) - 1,
                                         rounds, absl::Now(), core_.first_rounds));
  joined.data_parallel = data_parallel;
  joined.resume_floor = core_.ResumeFloorLocked();
  *core_.membership.FindMutable(joined.name) = joined;
  const Member& m = joined;
  core_.complement_reached |= core_.membership.size() >= core_.options.num_data_streams;
  core_.membership_cv.notify_all();
  if (core_.fragments[0].round > 0) {
    core_.EventLocked(
        absl::StrCat("island '", m.name, "' joined"),
        absl::StrCat(" at round ", core_.fragments[0].round, " (data stream ", m.data_stream,
                     "); rounds wait for it from round ", m.required_from[0], " on"));
  }

  return JoinedLocked(request, m);
}

pb::JoinResponse MembershipDesk::JoinedLocked(const pb::JoinRequest& request,
                                              const Member& m) const {
  pb::JoinResponse r;
  r.set_island_id(request.name());
  r.set_session(m.session);
  r.set_data_stream(m.data_stream);
  r.set_round(core_.fragments[0].round);
  core_.FillSchedule(r.mutable_schedule());
  r.set_config_hash(core_.options.config_hash);
  for (uint32_t f = 0; f < core_.fragments.size(); ++f) {
    auto* frag = r.add_fragments();
    frag->set_fragment(f);
    for (const auto& n : core_.fragments[f].layout.names) frag->add_parameters(n);
    frag->set_num_elements(core_.fragments[f].layout.total());
    if (ShardOwns(core_.options, f)) {
      frag->set_params_hash(core_.fragments[f].params_hash);
      frag->set_round(core_.fragments[f].round);
      frag->set_done_step(rounds_.DoneStepLocked(request.name(), f));
    }
  }
  for (const auto& address : core_.shard_addresses) r.add_shards(address);
  return r;
}

absl::Status MembershipDesk::Leave(const pb::LeaveRequest& request) {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  ATL_RETURN_IF_ERROR(CheckMembershipCall());
  std::vector<Rounds::CommitJob> jobs;
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    ATL_RETURN_IF_ERROR(AuthenticateMemberLocked(request.island_id(), request.session()));
    ATL_RETURN_IF_ERROR(core_.membership.Leave(request.island_id()));
    core_.membership_cv.notify_all();
    rounds_.ForgetLocked(request.island_id());
    if (!core_.AllDoneLocked()) {
      core_.EventLocked(absl::StrCat("island '", request.island_id(), "' left"),
                        absl::StrCat(" at round ", core_.fragments[0].round));
    }
    // Rounds may now be complete without the island that left.
    jobs = rounds_.TakeReadyLocked(absl::Now());
  }
  rounds_.RunCommits(std::move(jobs));
  return absl::OkStatus();
}

absl::StatusOr<pb::HeartbeatResponse> MembershipDesk::Heartbeat(
    const pb::HeartbeatRequest& request) {
  ATL_RETURN_IF_ERROR(core_.CheckRun(request.run_id()));
  ATL_RETURN_IF_ERROR(CheckMembershipCall());
  std::lock_guard<std::mutex> lock(core_.mu);
  ATL_RETURN_IF_ERROR(AuthenticateMemberLocked(request.island_id(), request.session()));
  ATL_RETURN_IF_ERROR(ValidateTelemetry(request.telemetry()));
  ATL_RETURN_IF_ERROR(core_.membership.Heartbeat(request.island_id(), absl::Now()));
  Member* member = core_.membership.FindMutable(request.island_id());
  if (request.finished()) member->finished = true;
  member->inner_step = request.inner_step();
  if (request.telemetry().stuck_reloads() > member->telemetry.stuck_reloads()) {
    core_.EventLocked(
        absl::StrCat("island '", request.island_id(), "' reloaded the same global parameters"),
        absl::StrCat(" again after a loss spike (", request.telemetry().stuck_reloads(),
                     " times, no commit between): it cannot train from them; the global model "
                     "may be damaged"));
  }
  member->telemetry = request.telemetry();
  if (request.telemetry().process() != 0) {
    core_.ledger.Trained(request.island_id(), request.telemetry().process(),
                         request.telemetry().tokens_trained());
  }
  // Its speed while it computes: the wall-clock rate (a window of some seconds) over the share of
  // wall time it computes. Right after a join or a coordinator restart the window holds the wait,
  // which made honest islands look slow and their claims false.
  const double utilization = request.telemetry().utilization();
  const double computing = utilization > 0 ? request.telemetry().tokens_per_s() / utilization
                                           : request.telemetry().tokens_per_s();
  member->peak_tokens_per_s = std::max(member->peak_tokens_per_s, computing);
  pb::HeartbeatResponse r;
  r.set_round(core_.fragments[0].round);
  r.set_membership_epoch(core_.membership.epoch());
  r.set_training_members(TrainingLocked());
  for (const auto& f : core_.fragments) r.add_versions(f.round);
  return r;
}

uint32_t MembershipDesk::TrainingLocked() {
  uint32_t training = 0;
  for (const auto& [id, m] : core_.membership.members()) training += m.finished ? 0 : 1;
  if (!core_.is_control_plane()) return training;
  // A sharded run is not over for the islands until every shard has reported its rounds after
  // the last member finished (ServiceCore::EndReports): each such shard counts as one training.
  auto& end = core_.end_reports;
  if (training > 0) {
    end.finished_at = absl::InfiniteFuture();
    return training;
  }
  if (end.finished_at == absl::InfiniteFuture()) {
    end.finished_at = absl::Now();
    std::fill(end.fresh.begin(), end.fresh.end(), false);
    core_.membership_cv.notify_all();
  }
  for (bool fresh : end.fresh) training += fresh ? 0 : 1;
  return training;
}

ServiceStatus MembershipDesk::GetStatus() const {
  std::lock_guard<std::mutex> lock(core_.mu);
  ServiceStatus status;
  const absl::Time now = absl::Now();
  const std::map<std::string, TokenAccount> tokens = core_.ledger.Totals();
  auto account = [&](const std::string& id) {
    auto it = tokens.find(id);
    return it == tokens.end() ? TokenAccount() : it->second;
  };
  for (const auto& [id, m] : core_.membership.members()) {
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
    i.tokens = account(id);
  }
  for (const auto& [id, state] : core_.membership.departed_states()) {
    if (core_.membership.Find(id) != nullptr) continue;  // it joined again
    IslandStatus& i = status.islands.emplace_back();
    i.island_id = id;
    i.state = StateName(state);
    i.tokens = account(id);
  }
  for (const auto& f : core_.fragments) status.rounds.push_back(f.round);
  for (const auto& f : core_.fragments) status.committed_rounds += f.round;
  status.membership_epoch = core_.membership.epoch();
  status.lease_expiries = core_.lease_expiries;
  return status;
}

pb::GetStateResponse MembershipDesk::GetState() const {
  std::lock_guard<std::mutex> lock(core_.mu);
  pb::GetStateResponse r;
  r.set_round(core_.fragments[0].round);
  r.set_membership_epoch(core_.membership.epoch());
  for (const auto& [id, m] : core_.membership.members()) {
    auto* i = r.add_islands();
    i->set_island_id(id);
    i->set_name(m.name);
    i->set_data_stream(m.data_stream);
    i->set_state(StateName(m.state));
  }
  core_.FillSchedule(r.mutable_schedule());
  const auto& committed = core_.fragments[0].committed;
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

absl::Status MembershipDesk::Authenticate(const std::string& island,
                                          const std::string& session) const {
  std::lock_guard<std::mutex> lock(core_.mu);
  return core_.membership.Authenticate(island, session);
}

absl::Status MembershipDesk::AuthenticateMemberLocked(const std::string& island,
                                                      const std::string& session) const {
  // Non-members get the caller's usual NOT_FOUND (which tells a dropped island to rejoin).
  if (core_.membership.Find(island) == nullptr) return absl::OkStatus();
  return core_.membership.Authenticate(island, session);
}

void MembershipDesk::Tick(absl::Time now) {
  std::vector<Rounds::CommitJob> jobs;
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    if (now >= core_.complement_deadline) core_.complement_reached = true;
    // Islands silent past their lease are dropped; rounds that waited only for them commit now
    // with the contributions that arrived (weights renormalized over those).
    const auto expired = core_.membership.ExpireLeases(now);
    if (!expired.empty()) core_.membership_cv.notify_all();
    for (const auto& name : expired) {
      rounds_.ForgetLocked(name);
      ++core_.lease_expiries;
      core_.EventLocked(absl::StrCat("island '", name, "' declared dead"),
                        absl::StrCat(" after ", absl::FormatDuration(core_.membership.lease()),
                                     " of silence; rounds go on without it"));
    }
    if (core_.on_event) {
      for (const auto& line : core_.event_limiter.Flush(now)) core_.on_event(line);
    }
    jobs = rounds_.TakeReadyLocked(now);
  }
  rounds_.RunCommits(std::move(jobs));
}

bool MembershipDesk::KnowsIsland(const std::string& name) const {
  std::lock_guard<std::mutex> lock(core_.mu);
  return core_.membership.Find(name) != nullptr ||
         core_.membership.departed_states().count(name) > 0;
}

size_t MembershipDesk::num_members() const {
  std::lock_guard<std::mutex> lock(core_.mu);
  return core_.membership.size();
}

}  // namespace atl::outer
