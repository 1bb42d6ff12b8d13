#include "outer/island_session.h"

#include "absl/strings/str_cat.h"

namespace atl::outer {

bool IsTransient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s);
}

absl::StatusOr<std::unique_ptr<IslandSession>> IslandSession::Join(Transport& transport,
                                                                   SessionOptions options) {
  pb::JoinRequest join;
  join.set_run_id(options.run_id);
  join.set_name(options.name);
  join.set_config_hash(options.config_hash);
  auto joined = Retry(options.retry, [&] { return transport.Join(join); });
  if (!joined.ok()) {
    return absl::Status(joined.status().code(), absl::StrCat("joining run '", options.run_id,
                                                             "': ", joined.status().message()));
  }
  return std::unique_ptr<IslandSession>(
      new IslandSession(transport, std::move(options), *std::move(joined)));
}

IslandSession::IslandSession(Transport& transport, SessionOptions options, pb::JoinResponse joined)
    : transport_(transport),
      options_(std::move(options)),
      joined_(std::move(joined)),
      data_stream_(joined_.data_stream()),
      identity_(std::make_shared<IslandIdentity>(joined_.island_id(), joined_.session())) {}

IslandSession::~IslandSession() { Leave(); }

pb::HeartbeatRequest IslandSession::Beat(bool finished) const {
  pb::HeartbeatRequest beat;
  beat.set_run_id(options_.run_id);
  beat.set_island_id(identity_->island_id());
  beat.set_session(identity_->session());
  beat.set_inner_step(uint64_t(step_.load()));
  beat.set_finished(finished);
  return beat;
}

absl::StatusOr<pb::HeartbeatResponse> IslandSession::Heartbeat(bool finished) {
  return transport_.Heartbeat(Beat(finished));
}

absl::Status IslandSession::WaitForPeers() {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration<double>(options_.retry.timeout_s);
  while (true) {
    auto state = Heartbeat(false);
    if (!state.ok()) return state.status();
    if (state->training_members() >= joined_.schedule().num_data_streams() || state->round() > 0 ||
        std::chrono::steady_clock::now() > until) {
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void IslandSession::StartHeartbeats() {
  if (heartbeats_.joinable()) return;
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

absl::Status IslandSession::Rejoin() {
  pb::JoinRequest join;
  join.set_run_id(options_.run_id);
  join.set_name(options_.name);
  join.set_config_hash(options_.config_hash);
  join.set_preferred_data_stream(data_stream_ + 1);
  auto again = Retry(options_.retry, [&] { return transport_.Join(join); });
  if (absl::IsAlreadyExists(again.status())) return absl::OkStatus();  // still a member
  if (!again.ok()) return again.status();
  identity_->set_session(again->session());
  joined_ = *std::move(again);
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
  if (left_) return;
  left_ = true;
  StopHeartbeats();  // no lease renewals after the goodbye
  pb::LeaveRequest l;
  l.set_run_id(options_.run_id);
  l.set_island_id(identity_->island_id());
  l.set_session(identity_->session());
  transport_.Leave(l).IgnoreError();
}

}  // namespace atl::outer
