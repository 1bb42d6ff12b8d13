#include "outer/service/membership.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/service/credentials.h"
#include "outer/base/names.h"

namespace atl::outer {

const char* StateName(MemberState state) {
  switch (state) {
    case MemberState::kJoining: return "joining";
    case MemberState::kActive: return "active";
    case MemberState::kLeaving: return "leaving";
    case MemberState::kDead: return "dead";
  }
  return "unknown";
}

bool TransitionAllowed(MemberState from, MemberState to) {
  switch (from) {
    case MemberState::kJoining:
      return to == MemberState::kActive || to == MemberState::kLeaving || to == MemberState::kDead;
    case MemberState::kActive:
      return to == MemberState::kLeaving || to == MemberState::kDead;
    case MemberState::kLeaving:
    case MemberState::kDead:
      return false;
  }
  return false;
}

Membership::Membership(uint32_t num_data_streams, absl::Duration lease)
    : num_data_streams_(num_data_streams), lease_(lease) {}

namespace {

// In a fragment's first round every island is waited for; later, from the next round on.
std::vector<uint64_t> RequiredFrom(const std::vector<uint64_t>& rounds,
                                   const std::vector<uint64_t>& first_rounds) {
  std::vector<uint64_t> from;
  for (size_t f = 0; f < rounds.size(); ++f) {
    const uint64_t first = f < first_rounds.size() ? first_rounds[f] : 0;
    from.push_back(rounds[f] == first ? rounds[f] : rounds[f] + 1);
  }
  return from;
}

std::optional<MemberState> ParseState(const std::string& name) {
  for (MemberState s : {MemberState::kJoining, MemberState::kActive, MemberState::kLeaving,
                        MemberState::kDead}) {
    if (name == StateName(s)) return s;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> Membership::Mirror(const pb::ShardSyncResponse& view,
                                            const std::vector<uint64_t>& rounds, absl::Time now,
                                            const std::vector<uint64_t>& first_rounds) {
  mirror_ = true;
  for (const auto& d : view.departed()) {
    const auto state = ParseState(d.state());
    if (!members_.count(d.island_id()) && state &&
        (*state == MemberState::kLeaving || *state == MemberState::kDead)) {
      Depart(d.island_id(), *state);
    }
  }
  std::map<std::string, const pb::ShardMember*> listed;
  for (const auto& m : view.members()) listed[m.island_id()] = &m;
  std::vector<std::string> gone;
  for (auto it = members_.begin(); it != members_.end();) {
    auto l = listed.find(it->first);
    if (l != listed.end() && l->second->session_sha256() == it->second.session) {
      it->second.finished = l->second->finished();
      ++it;
      continue;
    }
    // Departed, or rejoined under the same name with a new session: the old member is gone.
    gone.push_back(it->first);
    MemberState end = MemberState::kDead;
    for (const auto& d : view.departed()) {
      if (d.island_id() == it->first && d.state() == StateName(MemberState::kLeaving)) {
        end = MemberState::kLeaving;
      }
    }
    if (l == listed.end()) Depart(it->first, end);
    it = members_.erase(it);
  }
  for (const auto& [name, v] : listed) {
    if (members_.count(name) || !ValidateName(name, "island name").ok()) continue;
    Member m;
    m.name = name;
    m.data_stream = v->data_stream();
    m.last_seen = now;
    m.session = v->session_sha256();  // a mirror keeps the digest only
    m.finished = v->finished();
    m.data_parallel = std::max<uint32_t>(1, v->data_parallel());
    m.required_from = RequiredFrom(rounds, first_rounds);
    members_[name] = std::move(m);
    if (departed_.erase(name)) {
      departed_order_.erase(std::find(departed_order_.begin(), departed_order_.end(), name));
    }
  }
  epoch_ = view.membership_epoch();
  return gone;
}

std::vector<std::string> Membership::TakeHeard() {
  std::vector<std::string> names(heard_.begin(), heard_.end());
  heard_.clear();
  return names;
}

void Membership::FillView(pb::ShardSyncResponse* view) const {
  view->set_membership_epoch(epoch_);
  for (const auto& [name, m] : members_) {
    auto* v = view->add_members();
    v->set_island_id(name);
    v->set_session_sha256(CredentialDigest(m.session));
    v->set_data_stream(m.data_stream);
    v->set_finished(m.finished);
    v->set_data_parallel(m.data_parallel);
  }
  for (const auto& [name, state] : departed_) {
    auto* d = view->add_departed();
    d->set_island_id(name);
    d->set_state(StateName(state));
  }
}

absl::Status Membership::Move(Member& m, MemberState to) {
  if (!TransitionAllowed(m.state, to)) {
    return absl::FailedPreconditionError(absl::StrCat("island '", m.name, "' cannot go from ",
                                                      StateName(m.state), " to ", StateName(to)));
  }
  m.state = to;
  return absl::OkStatus();
}

absl::StatusOr<Member> Membership::Join(const std::string& name, int preferred_stream,
                                        const std::vector<uint64_t>& rounds, absl::Time now,
                                        const std::vector<uint64_t>& first_rounds) {
  ATL_RETURN_IF_ERROR(ValidateName(name, "island name"));
  if (members_.count(name)) {
    return absl::AlreadyExistsError(absl::StrCat("an island named '", name,
                                                 "' is already a member"));
  }
  std::vector<bool> taken(num_data_streams_, false);
  for (const auto& [id, m] : members_) taken[m.data_stream] = true;
  int stream = -1;
  if (preferred_stream >= 0 && preferred_stream < int(num_data_streams_) &&
      !taken[size_t(preferred_stream)]) {
    stream = preferred_stream;
  } else {
    const auto free = std::find(taken.begin(), taken.end(), false);
    if (free != taken.end()) stream = int(free - taken.begin());
  }
  if (stream < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", num_data_streams_, " data streams are taken by current members"));
  }
  Member m;
  m.name = name;
  m.data_stream = uint32_t(stream);
  m.last_seen = now;
  m.session = NewCredential();
  m.required_from = RequiredFrom(rounds, first_rounds);
  members_[name] = m;
  if (departed_.erase(name)) {
    departed_order_.erase(std::find(departed_order_.begin(), departed_order_.end(), name));
  }
  ++epoch_;
  return m;
}

absl::Status Membership::CheckMember(const std::string& name) const {
  if (members_.count(name)) return absl::OkStatus();
  if (mirror_ && !departed_.count(name)) {
    return absl::UnavailableError(absl::StrCat(
        "island ", Printable(name), " is not yet known to this shard of the service (it learns "
        "the membership from the coordinator); retry"));
  }
  if (auto it = departed_.find(name); it != departed_.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "island ", Printable(name), " is no longer a member (",
        it->second == MemberState::kDead
            ? absl::StrCat("declared dead after ", absl::FormatDuration(lease_), " of silence")
            : std::string("it left"),
        "): rejoin and fetch the global state"));
  }
  return absl::PermissionDeniedError(absl::StrCat("island ", Printable(name), " is not a member"));
}

absl::Status Membership::Authenticate(const std::string& name, const std::string& session) const {
  auto it = members_.find(name);
  if (it == members_.end()) return CheckMember(name);
  if (!CredentialMatches(it->second.session, mirror_ ? CredentialDigest(session) : session)) {
    if (mirror_) {
      return absl::UnavailableError(absl::StrCat(
          "this shard of the service does not know island '", name,
          "''s session (yet: it learns sessions from the coordinator); retry"));
    }
    return absl::UnauthenticatedError(absl::StrCat(
        "the call names island '", name, "' but does not carry its session credential"));
  }
  return absl::OkStatus();
}

void Membership::Depart(const std::string& name, MemberState state) {
  if (departed_.insert_or_assign(name, state).second) departed_order_.push_back(name);
  while (departed_order_.size() > kMaxDeparted) {
    departed_.erase(departed_order_.front());
    departed_order_.pop_front();
  }
}

absl::Status Membership::Heartbeat(const std::string& name, absl::Time now) {
  auto it = members_.find(name);
  if (it == members_.end()) {
    return absl::NotFoundError(std::string(CheckMember(name).message()));
  }
  it->second.last_seen = now;
  if (mirror_) heard_.insert(name);
  return absl::OkStatus();
}

absl::Status Membership::Contributed(const std::string& name, absl::Time now) {
  auto it = members_.find(name);
  if (it == members_.end()) return CheckMember(name);
  it->second.last_seen = now;
  if (mirror_) heard_.insert(name);
  if (it->second.state == MemberState::kJoining) return Move(it->second, MemberState::kActive);
  return absl::OkStatus();
}

absl::Status Membership::Leave(const std::string& name) {
  auto it = members_.find(name);
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat("island ", Printable(name), " is not a member"));
  }
  ATL_RETURN_IF_ERROR(Move(it->second, MemberState::kLeaving));
  Depart(name, MemberState::kLeaving);
  members_.erase(it);
  ++epoch_;
  return absl::OkStatus();
}

std::vector<std::string> Membership::ExpireLeases(absl::Time now) {
  std::vector<std::string> dead;
  if (mirror_) return dead;
  for (auto it = members_.begin(); it != members_.end();) {
    if (now - it->second.last_seen > lease_ && Move(it->second, MemberState::kDead).ok()) {
      dead.push_back(it->first);
      Depart(it->first, MemberState::kDead);
      it = members_.erase(it);
    } else {
      ++it;
    }
  }
  if (!dead.empty()) ++epoch_;
  return dead;
}

const Member* Membership::Find(const std::string& name) const {
  auto it = members_.find(name);
  return it == members_.end() ? nullptr : &it->second;
}

Member* Membership::FindMutable(const std::string& name) {
  auto it = members_.find(name);
  return it == members_.end() ? nullptr : &it->second;
}

bool Membership::Required(const Member& m, uint32_t fragment, uint64_t round) {
  return fragment >= m.required_from.size() || m.required_from[fragment] <= round;
}

}  // namespace atl::outer
