#include "outer/island/island_session.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"

namespace atl::outer {

SessionOptions SessionOptionsOf(const OuterConfig& outer, std::string name, uint64_t config_hash,
                                std::string credential_file) {
  SessionOptions o;
  o.run_id = outer.run_id;
  o.name = std::move(name);
  o.config_hash = config_hash;
  o.heartbeat_s = outer.heartbeat_s;
  o.retry.timeout_s = outer.reconnect_timeout_s;
  o.credential_file = std::move(credential_file);
  return o;
}

bool IsTransient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s);
}

absl::Status SleepUnlessInterrupted(const RetryPolicy& policy, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    if (policy.interrupted) ATL_RETURN_IF_ERROR(policy.interrupted());
    const double left =
        seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left <= 0) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.1)));
  }
}

namespace {

// The membership a crashed run of this island left behind, ended (best effort).
void EndOldMembership(Transport& transport, const SessionOptions& options) {
  if (options.credential_file.empty()) return;
  std::ifstream in(options.credential_file);
  std::string island, session;
  if (!std::getline(in, island) || !std::getline(in, session) || island != options.name) return;
  pb::LeaveRequest leave;
  leave.set_run_id(options.run_id);
  leave.set_island_id(island);
  leave.set_session(session);
  transport.Leave(leave).IgnoreError();
}

std::string CoordinatorAt(const Transport& transport) {
  return transport.address().empty() ? "the coordinator" : "the coordinator at " + transport.address();
}

// The session's retries, saying what they wait for ("joining", "rejoining") every few seconds.
RetryPolicy Saying(const SessionOptions& options, const Transport& transport, const std::string& what) {
  RetryPolicy retry = options.retry;
  if (!options.say) return retry;
  retry.say = [say = options.say, run = options.run_id, where = CoordinatorAt(transport), what,
               limit = retry.timeout_s](const absl::Status& last, double elapsed_s, double next_s) {
    say(absl::StrFormat("still %s run '%s': no answer from %s for %.0f s of %g "
                        "(outer.reconnect_timeout_s): %s; next try in %.1f s",
                        what, run, where, elapsed_s, limit, last.message(), next_s));
  };
  return retry;
}

pb::JoinRequest JoinRequestOf(const SessionOptions& options) {
  pb::JoinRequest join;
  join.set_run_id(options.run_id);
  join.set_name(options.name);
  join.set_config_hash(options.config_hash);
  join.set_data_parallel(options.data_parallel);
  for (const auto& [name, numel] : options.parameters) {
    auto* p = join.add_parameters();
    p->set_name(name);
    p->set_numel(numel);
  }
  return join;
}

}  // namespace

void IslandSession::KeepCredential() const {
  if (options_.credential_file.empty()) return;
  const std::string tmp = options_.credential_file + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;
  const std::string text = identity_->island_id() + "\n" + identity_->session() + "\n";
  const bool ok = write(fd, text.data(), text.size()) == ssize_t(text.size());
  close(fd);
  if (ok) rename(tmp.c_str(), options_.credential_file.c_str());
}

absl::StatusOr<std::unique_ptr<IslandSession>> IslandSession::Join(Transport& transport,
                                                                   SessionOptions options) {
  EndOldMembership(transport, options);
  const pb::JoinRequest join = JoinRequestOf(options);
  if (options.say) {
    options.say(absl::StrCat("joining run '", options.run_id, "' at ", CoordinatorAt(transport)));
  }
  const auto start = std::chrono::steady_clock::now();
  auto joined = Retry(Saying(options, transport, "joining"), [&] { return transport.Join(join); });
  if (!joined.ok()) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return absl::Status(
        joined.status().code(),
        absl::StrFormat("joining run '%s': not joined with %s after %.1f s (%s): %s",
                        options.run_id, CoordinatorAt(transport), waited,
                        IsTransient(joined.status())
                            ? absl::StrFormat("outer.reconnect_timeout_s = %g", options.retry.timeout_s)
                            : "not a passing failure, not retried",
                        joined.status().message()));
  }
  std::unique_ptr<IslandSession> session(
      new IslandSession(transport, std::move(options), *std::move(joined)));
  session->KeepCredential();
  return session;
}

namespace {

class OneRank : public IslandRanks {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::StatusOr<bool> Any(bool flag) override { return flag; }
  absl::StatusOr<std::string> FromFirst(const std::string& bytes) override { return bytes; }
  absl::StatusOr<std::string> FromFirstWhere(bool, const std::string& bytes) override {
    return bytes;
  }
};

}  // namespace

std::unique_ptr<IslandRanks> SingleRank() { return std::make_unique<OneRank>(); }

std::unique_ptr<IslandSession> IslandSession::Follow(Transport& transport, SessionOptions options,
                                                     pb::JoinResponse joined) {
  std::unique_ptr<IslandSession> s(new IslandSession(transport, std::move(options), std::move(joined)));
  s->follower_ = true;
  return s;
}

// Rank 0's outcome travels as a status code and, when it joined, its answer.
absl::StatusOr<std::unique_ptr<IslandSession>> IslandSession::JoinAsIsland(Transport& transport,
                                                                           SessionOptions options,
                                                                           IslandRanks& ranks) {
  if (ranks.size() == 1) return Join(transport, std::move(options));
  std::unique_ptr<IslandSession> session;
  std::string shared;
  if (ranks.rank() == 0) {
    auto joined = Join(transport, options);
    shared = joined.ok() ? (*joined)->joined().SerializeAsString()
                         : std::string("!") + std::string(joined.status().message());
    if (joined.ok()) session = *std::move(joined);
  }
  ATL_ASSIGN_OR_RETURN(auto answer, ranks.FromFirst(shared));
  if (!answer.empty() && (answer)[0] == '!') {
    return absl::UnavailableError(absl::StrCat("rank 0 could not join: ", answer.substr(1)));
  }
  if (ranks.rank() == 0) return session;
  pb::JoinResponse joined;
  if (!joined.ParseFromString(answer))
    return absl::DataLossError("rank 0's join answer is garbled");
  return Follow(transport, std::move(options), std::move(joined));
}

IslandSession::IslandSession(Transport& transport, SessionOptions options, pb::JoinResponse joined)
    : transport_(transport),
      options_(std::move(options)),
      joined_(std::move(joined)),
      data_stream_(joined_.data_stream()),
      identity_(std::make_shared<IslandIdentity>(joined_.island_id(), joined_.session())) {
  transport_.Route(joined_);
}

IslandSession::~IslandSession() { Leave(); }

pb::HeartbeatRequest IslandSession::Beat(bool finished) const {
  pb::HeartbeatRequest beat;
  beat.set_run_id(options_.run_id);
  beat.set_island_id(identity_->island_id());
  beat.set_session(identity_->session());
  beat.set_inner_step(uint64_t(step_.load()));
  beat.set_finished(finished);
  std::lock_guard<std::mutex> lock(telemetry_mu_);
  *beat.mutable_telemetry() = telemetry_;
  return beat;
}

void IslandSession::set_telemetry(const pb::IslandTelemetry& telemetry) {
  std::lock_guard<std::mutex> lock(telemetry_mu_);
  telemetry_ = telemetry;
}

absl::StatusOr<pb::HeartbeatResponse> IslandSession::Heartbeat(bool finished) {
  if (follower_) return absl::FailedPreconditionError("only rank 0 speaks for the island");
  return transport_.Heartbeat(Beat(finished));
}

absl::Status IslandSession::WaitForPeers() {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration<double>(options_.retry.timeout_s);
  while (true) {
    ATL_ASSIGN_OR_RETURN(auto state, Heartbeat(false));
    if (state.training_members() >= joined_.schedule().num_data_streams() || state.round() > 0 ||
        std::chrono::steady_clock::now() > until) {
      return absl::OkStatus();
    }
    ATL_RETURN_IF_ERROR(SleepUnlessInterrupted(options_.retry, 0.05));
  }
}

void IslandSession::StartHeartbeats() {
  if (follower_ || heartbeats_.joinable()) return;
  stop_ = false;
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
}

void IslandSession::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto period = std::chrono::duration<double>(options_.heartbeat_s);
  while (!cv_.wait_for(lock, period, [&] { return stop_; })) {
    const pb::HeartbeatRequest beat = Beat(false);
    lock.unlock();
    auto r = transport_.Heartbeat(beat);
    lock.lock();
    if (!r.ok() && (absl::IsNotFound(r.status()) || absl::IsPermissionDenied(r.status()))) {
      refusal_ = r.status();
    }
  }
}

std::optional<absl::Status> IslandSession::TakeRefusal() {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = std::move(refusal_);
  refusal_.reset();
  return r;
}

absl::Status IslandSession::Rejoin(IslandRanks& ranks) {
  std::string shared;
  if (!follower_) {
    pb::JoinRequest join = JoinRequestOf(options_);
    join.set_preferred_data_stream(data_stream_ + 1);
    auto again = Retry(Saying(options_, transport_, "rejoining"), [&] { return transport_.Join(join); });
    if (absl::IsAlreadyExists(again.status())) {
      shared = joined_.SerializeAsString();  // still a member: the session holds
    } else if (!again.ok()) {
      shared = std::string("!") + std::string(again.status().message());
    } else {
      shared = again->SerializeAsString();
    }
  }
  ATL_ASSIGN_OR_RETURN(auto answer, ranks.FromFirst(shared));
  if (!answer.empty() && (answer)[0] == '!') {
    return absl::UnavailableError(absl::StrCat("rejoining: ", answer.substr(1)));
  }
  pb::JoinResponse joined;
  if (!joined.ParseFromString(answer))
    return absl::DataLossError("rank 0's join answer is garbled");
  identity_->set_session(joined.session());
  joined_ = std::move(joined);
  transport_.Route(joined_);
  if (!follower_) KeepCredential();
  return absl::OkStatus();
}

void IslandSession::StopHeartbeats() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (heartbeats_.joinable()) heartbeats_.join();
}

void IslandSession::Leave() {
  if (left_ || follower_) return;
  left_ = true;
  StopHeartbeats();  // no lease renewals after the goodbye
  pb::LeaveRequest l;
  l.set_run_id(options_.run_id);
  l.set_island_id(identity_->island_id());
  l.set_session(identity_->session());
  transport_.Leave(l).IgnoreError();
  if (!options_.credential_file.empty()) unlink(options_.credential_file.c_str());
}

}  // namespace atl::outer
