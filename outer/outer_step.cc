#include "outer/outer_step.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/checksum.h"
#include "compression/codec.h"

namespace atl::outer {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

OuterStepHook::OuterStepHook(Transport& transport, IslandSession& session, IslandModel& model,
                             std::vector<uint64_t> fragment_sizes, OuterStepOptions options)
    : transport_(transport),
      session_(session),
      model_(model),
      options_(std::move(options)),
      schedule_(int(options_.sync_every), int(fragment_sizes.size())),
      last_push_(fragment_sizes.size(), model.step()),
      next_due_(fragment_sizes.size()),
      h_now_(options_.sync_every) {
  IslandSyncOptions sync = options_.sync;
  sync.async = options_.async;
  for (uint32_t f = 0; f < fragment_sizes.size(); ++f) {
    sync.fragment = f;
    syncs_.push_back(std::make_unique<IslandSync>(&transport_, session_.run_id(),
                                                  session_.identity(), fragment_sizes[f], sync));
    next_due_[f] = schedule_.offset(int(f)) > 0 ? schedule_.offset(int(f)) : options_.sync_every;
  }
}

OuterStepHook::~OuterStepHook() {
  // Background pushes hold this hook's syncs: they finish before it goes.
  for (auto& job : in_flight_) job.result.wait();
}

int64_t OuterStepHook::max_steps() const {
  return options_.async ? options_.total_steps * int64_t(options_.num_data_streams)
                        : options_.total_steps;
}

absl::Status OuterStepHook::FetchGlobal() {
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    // A coordinator that restarts right now is waited for, as for a join.
    if (auto s = Retry(options_.retry, [&] { return syncs_[f]->FetchGlobal(); }); !s.ok()) {
      return s;
    }
    model_.Merge(f, syncs_[f]->global(), 0.0);
  }
  return absl::OkStatus();
}

void OuterStepHook::ReloadGlobal() {
  for (uint32_t f = 0; f < syncs_.size(); ++f) model_.Merge(f, syncs_[f]->global(), 0.0);
}

uint64_t OuterStepHook::fetched_bytes() const {
  uint64_t n = 0;
  for (const auto& s : syncs_) n += s->fetched_bytes();
  return n;
}

uint64_t OuterStepHook::global_hash() const {
  std::vector<float> all;
  for (const auto& s : syncs_) all.insert(all.end(), s->global().begin(), s->global().end());
  return compression::Checksum(all.data(), all.size() * sizeof(float));
}

std::vector<uint32_t> OuterStepHook::DueAfter(int64_t t) const {
  if (!options_.async) return schedule_.DueAfter(t);
  std::vector<uint32_t> due;
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    if (next_due_[f] <= t) due.push_back(f);
  }
  return due;
}

int64_t OuterStepHook::Delay() const {
  // Async: a fragment lands before its next push, so tau stays below the island's current H.
  return options_.async ? std::min<int64_t>(options_.tau, h_now_ - 1) : options_.tau;
}

bool OuterStepHook::IsLast(int64_t t) const {
  return options_.async ? (finishing_ || t == max_steps()) : t == options_.total_steps;
}

absl::Status OuterStepHook::AfterStep(double steps_per_s) {
  if (!pending_rejoin_) pending_rejoin_ = session_.TakeRefusal();
  if (pending_rejoin_) {
    // Back on the global parameters (and, sync, at the run's step): the next push is a round away.
    if (auto s = LandAll(0.0); !s.ok()) return s;
    if (auto s = Rejoin(*pending_rejoin_); !s.ok()) return s;
    done_ = IsLast(model_.step());
    return absl::OkStatus();
  }
  const int64_t t = model_.step();
  done_ = IsLast(t);
  // Merge what is due (tau steps after its push), then push the fragments due now.
  if (auto s = LandDue(t, options_.alpha); !s.ok()) return s;
  if (!done_) {
    for (uint32_t f : DueAfter(t)) Push(f, t, t + Delay(), steps_per_s);
    return LandDue(t, options_.alpha);  // tau = 0: blocking
  }
  // The run ends synced: everything in flight lands, then each fragment is pushed and merged in
  // turn (alpha 0: the island ends on the global parameters).
  if (auto s = LandAll(0.0); !s.ok()) return s;
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    Push(f, t, t, steps_per_s);
    if (auto s = Land(0.0); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void OuterStepHook::Push(uint32_t f, int64_t t, int64_t apply_at, double steps_per_s) {
  InFlight job;
  job.fragment = f;
  job.pushed_at = t;
  job.apply_at = apply_at;
  job.bytes = compression::EncodedBytes(options_.sync.codec, syncs_[f]->global().size());
  const uint64_t tokens = uint64_t(t - last_push_[f]) * uint64_t(options_.tokens_per_step);
  last_push_[f] = t;
  next_due_[f] = t + h_now_;
  job.result = std::async(std::launch::async, [sync = syncs_[f].get(), local = model_.Snapshot(f),
                                               tokens, steps_per_s] {
    return sync->SyncRound(local, tokens, steps_per_s);
  });
  bytes_in_flight_ += job.bytes;
  stats_.peak_bytes_in_flight = std::max(stats_.peak_bytes_in_flight, bytes_in_flight_);
  in_flight_.push_back(std::move(job));
}

absl::Status OuterStepHook::LandDue(int64_t t, double alpha) {
  while (!in_flight_.empty() && in_flight_.front().apply_at <= t) {
    if (auto s = Land(alpha); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status OuterStepHook::LandAll(double alpha) {
  while (!in_flight_.empty()) {
    if (auto s = Land(alpha); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Waits for the oldest fragment in flight and merges its update.
absl::Status OuterStepHook::Land(double alpha) {
  InFlight job = std::move(in_flight_.front());
  in_flight_.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  auto outcome = job.result.get();
  const double idle_s = Since(t0);
  bytes_in_flight_ -= job.bytes;
  const absl::Status& s = outcome.status();
  if (absl::IsPermissionDenied(s) || absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    // The service no longer counts this island as a member (declared dead while it was silent),
    // or is gone (restarting from its durable state): the contribution is lost; the island
    // rejoins, with retries, and loads the global state before its next push.
    if (!pending_rejoin_) pending_rejoin_ = s;
    return absl::OkStatus();
  }
  if (!outcome.ok()) {
    return absl::Status(s.code(), absl::StrCat("outer round of fragment ", job.fragment, ": ",
                                               s.message()));
  }
  model_.Merge(job.fragment, syncs_[job.fragment]->global(), outcome->resynced ? 0.0 : alpha);
  if (options_.async) {
    if (outcome->sync_every > 0) h_now_ = outcome->sync_every;
    finishing_ |= outcome->budget_reached;
    if (outcome->tokens_committed > stats_.run_tokens && options_.token_budget > 0) {
      stats_.run_tokens = outcome->tokens_committed;
      model_.FollowRunProgress(int64_t(double(stats_.run_tokens) /
                                       double(options_.token_budget) *
                                       double(options_.total_steps)));
    }
    stats_.staleness.push_back(outcome->staleness);
  }
  stats_.rounds += 1;
  stats_.resyncs += outcome->resynced ? 1 : 0;
  stats_.idle_s += idle_s;
  stats_.bytes_sent += outcome->bytes_sent;
  stats_.bytes_received += outcome->bytes_received;
  if (observer_) {
    LandedRound landed;
    landed.fragment = job.fragment;
    landed.pushed_at = job.pushed_at;
    landed.step = model_.step();
    landed.idle_s = idle_s;
    landed.sync_every = uint32_t(options_.async ? h_now_ : options_.sync_every);
    landed.global_hash = syncs_[job.fragment]->global_hash();
    landed.outcome = *std::move(outcome);
    observer_(landed);
  }
  return absl::OkStatus();
}

absl::Status OuterStepHook::Rejoin(const absl::Status& why) {
  if (on_message) on_message(absl::StrCat("rejoining the run: ", why.message()));
  if (auto s = session_.Rejoin(); !s.ok()) return s;
  if (session_.joined().data_stream() != session_.data_stream() && on_message) {
    on_message(absl::StrCat("warning: its data stream ", session_.data_stream(),
                            " was taken meanwhile (the service assigned ",
                            session_.joined().data_stream(), "); this island goes on reading stream ",
                            session_.data_stream()));
  }
  if (auto s = FetchGlobal(); !s.ok()) return s;
  pending_rejoin_.reset();
  stats_.rejoins += 1;
  if (!options_.async) {
    // Back in step with the run (the service may have lost rounds this island had done).
    model_.JumpToStep(int64_t(syncs_[0]->round()) * options_.sync_every);
    std::fill(last_push_.begin(), last_push_.end(), model_.step());
  }
  if (on_message) on_message(absl::StrCat("rejoined at round ", syncs_[0]->round()));
  return absl::OkStatus();
}

absl::Status OuterStepHook::Finish(bool stopped) {
  if (options_.async && !stopped) {
    if (auto s = CatchUpWithTheRun(); !s.ok()) return s;
  }
  return LandAll(0.0);
}

// Says this island has finished, waits until every other one has too, then applies the versions
// committed since, checking every hash.
absl::Status OuterStepHook::CatchUpWithTheRun() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + std::chrono::duration<double>(options_.round_timeout_s);
  absl::StatusOr<pb::HeartbeatResponse> state;
  while (true) {
    state = session_.Heartbeat(/*finished=*/true);
    if (!state.ok()) return state.status();
    if (state->training_members() == 0 || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (state->versions_size() != int(syncs_.size())) {
    return absl::DataLossError("the service's heartbeat names the wrong fragments");
  }
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    auto caught = syncs_[f]->CatchUp(state->versions(int(f)));
    if (!caught.ok()) return caught.status();
    stats_.bytes_received += caught->bytes_received;
    stats_.resyncs += caught->resynced ? 1 : 0;
    model_.Merge(f, syncs_[f]->global(), 0.0);
  }
  stats_.idle_s += Since(t0);
  if (on_message) {
    on_message(absl::StrCat("finished: caught up with version ", state->versions(0),
                            " of the run after ", absl::StrFormat("%.1f", Since(t0)), "s"));
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
