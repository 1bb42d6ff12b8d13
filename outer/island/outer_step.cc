#include "outer/island/outer_step.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "compression/status_macros.h"
#include "outer/island/moment_sync.h"

namespace atl::outer {

absl::Status CheckRunMode(const OuterConfig& outer, const pb::OuterSchedule& schedule) {
  if (schedule.async() == outer.async()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this island is configured for outer.mode = \"", ConfigValueText(outer.mode),
                   "\" but the run is ", schedule.async() ? "async" : "sync"));
}

pb::IslandTelemetry TelemetryOf(const TrainingFigures& f, const OuterStepStats& stats) {
  auto bounded = [](double v, double max) { return std::isfinite(v) ? std::clamp(v, 0.0, max) : 0.0; };
  static const uint64_t process =
      (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^ 1;
  pb::IslandTelemetry t;
  t.set_loss(bounded(f.loss, 1e4));
  t.set_val_loss(f.val_loss ? bounded(*f.val_loss, 1e4) : 0.0);
  t.set_val_bpb(f.val_bpb ? bounded(*f.val_bpb, 1e4) : 0.0);
  t.set_tokens_per_s(bounded(f.tokens_per_s, 1e12));
  t.set_utilization(bounded(f.utilization, 1));
  t.set_tokens(f.tokens);
  t.set_process(process);
  t.set_tokens_trained(f.tokens_trained);
  t.set_stuck_reloads(f.stuck_reloads);
  t.set_bytes_sent(stats.bytes_sent);
  t.set_bytes_received(stats.bytes_received);
  t.set_elements_synced(stats.elements_synced);
  return t;
}
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

SyncPhases PhasesOf(const pb::OuterSchedule& schedule) {
  SyncPhases p;
  p.warm_start_steps = int64_t(std::min<uint64_t>(schedule.warm_start_steps(), INT32_MAX));
  p.early_sync_every = int(std::min<uint32_t>(schedule.early_sync_every(), INT32_MAX));
  p.early_sync_steps = int64_t(std::min<uint64_t>(schedule.early_sync_steps(), INT32_MAX));
  return p;
}

std::string OuterStepHook::Describe() const {
  return absl::StrFormat("H = %d, %d fragment(s), tau = %d, %s, %s", options_.schedule.sync_every,
                         syncs_.size(), options_.island.tau,
                         eager_.empty() ? absl::StrFormat("alpha = %.2f", options_.island.alpha)
                                        : std::string("eager updates"),
                         compression::CodecName(options_.island.sync.codec.codec));
}

RunSchedule ScheduleOf(const pb::OuterSchedule& schedule) {
  RunSchedule s;
  s.total_steps = int64_t(schedule.total_inner_steps());
  s.sync_every = schedule.sync_every();
  s.phases = PhasesOf(schedule);
  s.async = schedule.async();
  s.token_budget = schedule.token_budget();
  s.num_data_streams = schedule.num_data_streams();
  s.moment_sync_every = schedule.async() ? 0 : schedule.moment_sync_every();
  return s;
}

IslandChoices IslandChoicesOf(const OuterConfig& outer, uint64_t rounding_seed) {
  IslandChoices c;
  c.tau = outer.fragment_sync_delay;
  c.auto_tune = outer.auto_tune;
  c.alpha = outer.alpha();
  c.eager_gain = outer.eager_updates ? EagerGain(outer.optimizer) : 0.0;
  c.round_timeout_s = outer.round_timeout_s;
  c.retry.timeout_s = outer.reconnect_timeout_s;
  c.sync.codec = outer.wire_codec();
  c.sync.error_feedback = outer.error_feedback;
  c.sync.error_feedback_decay = float(outer.error_feedback_decay);
  c.sync.stochastic_rounding = outer.stochastic_rounding;
  c.sync.seed = rounding_seed;
  c.sync.fault = outer.fault == "sign_flip" ? IslandSyncOptions::Fault::kSignFlip
                 : outer.fault == "noise"   ? IslandSyncOptions::Fault::kNoise
                                            : IslandSyncOptions::Fault::kNone;
  c.sync.fault_rounds = uint64_t(outer.fault_rounds);
  return c;
}

OuterStepHook::OuterStepHook(Transport& transport, IslandSession& session, IslandRanks& ranks,
                             IslandModel& model, std::vector<FragmentShare> fragments,
                             OuterStepOptions options)
    : transport_(transport),
      session_(session),
      ranks_(ranks),
      model_(model),
      options_(std::move(options)),
      last_push_(fragments.size(), model.step()) {
  policy_ = MakeRoundPolicy(options_, uint32_t(fragments.size()));
  IslandSyncOptions sync = options_.island.sync;
  sync.async = options_.schedule.async;
  for (uint32_t f = 0; f < fragments.size(); ++f) {
    sync.fragment = f;
    sync.ranges = fragments[f].ranges;
    sync.carried = fragments[f].carried;
    syncs_.push_back(std::make_unique<IslandSync>(&transport_, session_.run_id(),
                                                  session_.identity(), fragments[f].elements, sync));
    syncs_.back()->set_device_copy(model_.device_copy(f));
    if (options_.island.eager_gain > 0 && !options_.schedule.async) {
      eager_.emplace_back(options_.island.eager_gain,
                          std::max<uint32_t>(1, options_.schedule.num_data_streams));
    }
  }
  stats_.tau = policy_->Delay();
}

OuterStepHook::~OuterStepHook() {
  // Background pushes hold this hook's syncs: they finish before it goes.
  for (auto& job : in_flight_) job.result.wait();
}

int64_t OuterStepHook::max_steps() const { return policy_->max_steps(); }

absl::Status OuterStepHook::FetchGlobal() {
  ATL_RETURN_IF_ERROR(LoadGlobal());
  // Sync: a joiner takes part from the rounds it holds (outer/island/round_policy.cc): a new island
  // at the step they put it, so that its step count, its learning-rate schedule and its last step
  // line up with the other islands'; a restarted one at its own step (it owes the steps since).
  // With fragments the step follows every fragment's round, not fragment 0's alone (a fragment's
  // round starts up to H steps after fragment 0's), and a round may have committed between the
  // join's answer and the fetch (the round an island joins in does not wait for it).
  const std::vector<uint64_t> rounds = Rounds();
  if (!options_.schedule.async &&
      std::any_of(rounds.begin(), rounds.end(), [](uint64_t r) { return r > 0; })) {
    policy_->Rejoined(Where(/*ahead=*/false), model_);
    std::fill(last_push_.begin(), last_push_.end(), model_.step());
    // A joiner without a checkpoint: the run's moments rather than zeros (at its new step).
    std::vector<IslandSync*> syncs;
    for (auto& sync : syncs_) syncs.push_back(sync.get());
    stats_.joined_with_moments =
        TakeNewestMoments(model_, syncs, options_.schedule.moment_sync_every, on_message);
  }
  return absl::OkStatus();
}

absl::Status OuterStepHook::LoadGlobal() {
  const uint64_t bytes0 = fetched_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    // Before the fragment's first commit, a joiner's seeded initial parameters are the service's:
    // no download (the hash says). With auto-tune the download is the island's measure of its
    // link: kept.
    const auto& joined = session_.joined();
    if (!options_.island.auto_tune && int(f) < joined.fragments_size() &&
        joined.fragments(int(f)).round() == 0 && joined.fragments(int(f)).params_hash() != 0 &&
        syncs_[f]->Adopt(model_.Snapshot(f), joined.fragments(int(f)).round(),
                         joined.fragments(int(f)).params_hash())
            .ok()) {
      ++stats_.seeded_fragments;
      continue;
    }
    // A coordinator that restarts right now is waited for, as for a join.
    if (auto s = Retry(options_.island.retry, [&] { return syncs_[f]->FetchGlobal(); }); !s.ok()) {
      return s;
    }
  }
  // The whole state over the real channel: the island's measure of its link to the service.
  const double seconds = Since(t0);
  if (fetched_bytes() > bytes0 && seconds > 0) {
    stats_.link_bps = 8.0 * double(fetched_bytes() - bytes0) / seconds;
    for (auto& sync : syncs_) sync->set_link_bps(stats_.link_bps);
  }
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    ATL_RETURN_IF_ERROR(AgreeOnRound(f));
    model_.Merge(f, syncs_[f]->global(), 0.0);
  }
  return absl::OkStatus();
}

RejoinPoint OuterStepHook::Where(bool ahead) const {
  RejoinPoint at;
  at.rounds = Rounds();
  for (const auto& f : session_.joined().fragments()) at.done.push_back(f.done_step());
  at.ahead = ahead;
  return at;
}

std::vector<uint64_t> OuterStepHook::Rounds() const {
  std::vector<uint64_t> rounds;
  for (const auto& sync : syncs_) rounds.push_back(sync->round());
  return rounds;
}

absl::Status OuterStepHook::ReloadGlobal() {
  // The rounds in flight land first, merged with alpha 0: their tasks write the global copies.
  ATL_RETURN_IF_ERROR(LandAll());
  for (uint32_t f = 0; f < syncs_.size(); ++f) model_.Merge(f, syncs_[f]->global(), 0.0);
  // The steps since the last push are gone: the next push claims only the steps after this one.
  std::fill(last_push_.begin(), last_push_.end(), model_.step());
  // The same global parameters twice: the island cannot train from them (every step since went
  // wrong), and no commit came between to change them.
  const std::vector<uint64_t> hashes = fragment_hashes();
  if (hashes == reloaded_hashes_) {
    ++stuck_reloads_;
    if (on_message) {
      on_message(absl::StrCat("reloaded the same global parameters again (", stuck_reloads_,
                              " time", stuck_reloads_ == 1 ? "" : "s",
                              ") with no commit between: the global model may be damaged; told "
                              "the service"));
    }
  }
  reloaded_hashes_ = hashes;
  return absl::OkStatus();
}

uint64_t OuterStepHook::fetched_bytes() const {
  uint64_t n = 0;
  for (const auto& s : syncs_) n += s->fetched_bytes();
  return n;
}

std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> OuterStepHook::RangeHashes(uint32_t f) const {
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> out;
  const auto& sync = *syncs_[f];
  uint64_t at = 0;
  for (const auto& [begin, end] : sync.ranges()) {
    out.emplace_back(begin, end,
                     compression::ParamsHash(sync.global().data() + at, begin, end - begin));
    at += end - begin;
  }
  return out;
}

uint64_t OuterStepHook::global_hash() const {
  std::vector<float> all;
  for (const auto& s : syncs_) all.insert(all.end(), s->global().begin(), s->global().end());
  return compression::ParamsHash(all.data(), 0, all.size());  // one fragment: the service's
}

std::vector<uint64_t> OuterStepHook::fragment_hashes() const {
  std::vector<uint64_t> out;
  for (const auto& s : syncs_) out.push_back(s->global_hash());
  return out;
}

absl::Status OuterStepHook::AfterStep(double steps_per_s) {
  steps_per_s_ = steps_per_s;
  if (!pending_rejoin_) pending_rejoin_ = session_.TakeRefusal();
  // A rejoin changes what every rank does next: the island rejoins when any rank needs to.
  ATL_ASSIGN_OR_RETURN(auto rejoin, ranks_.Any(pending_rejoin_.has_value()));
  if (rejoin && !pending_rejoin_) pending_rejoin_ = absl::UnavailableError("another rank rejoins");
  if (pending_rejoin_) {
    // What is in flight lands as it would have (pushes that did not get through are kept), then
    // the island rejoins with its progress (outer/island/rejoin.cc).
    ATL_RETURN_IF_ERROR(LandAll(/*keep_local=*/!options_.schedule.async));
    ATL_RETURN_IF_ERROR(Rejoin(*pending_rejoin_));
    done_ = policy_->IsLast(model_.step());
    return absl::OkStatus();
  }
  const int64_t t = model_.step();
  done_ = policy_->IsLast(t);
  // Merge what is due (tau steps after its push), then push the fragments due now.
  ATL_RETURN_IF_ERROR(LandDue(t));
  if (!done_) {
    policy_->Advance(t);
    for (uint32_t f : policy_->DueAfter(t)) Push(f, t, t + policy_->DelayAfter(f, t), steps_per_s);
    return LandDue(t);  // tau = 0: blocking
  }
  // The run ends synced: everything in flight lands, then each fragment is pushed and merged in
  // turn (alpha 0: the island ends on the global parameters). A push of the last step is the
  // island's last of its fragment: the service does not wait for it in that fragment's later
  // rounds (those of an island that trains on after it, owing steps).
  ATL_RETURN_IF_ERROR(LandAll());
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    Push(f, t, t, steps_per_s);
    ATL_RETURN_IF_ERROR(Land(false));
  }
  return absl::OkStatus();
}

bool OuterStepHook::CarryRefused(const InFlight& job, const RoundOutcome& outcome) {
  // One rank (ranks could disagree on whether their parts were refused), on the host.
  const uint32_t f = job.fragment;
  if (outcome.refused_from.empty() || ranks_.size() != 1 || job.eager || job.averaging ||
      options_.schedule.async || model_.device_copy(f) != nullptr) {
    return false;
  }
  std::vector<float> local = model_.Snapshot(f);
  const std::vector<float>& global = syncs_[f]->global();
  const std::vector<float>& base = outcome.refused_from;
  if (local.size() != global.size() || base.size() != global.size()) return false;
  for (size_t i = 0; i < local.size(); ++i) local[i] = global[i] + (local[i] - base[i]);
  model_.Merge(f, local, 0.0);
  last_push_[f] = job.since;
  if (on_message) {
    on_message(absl::StrCat("fragment ", f, ": its push of step ", job.pushed_at,
                            " was refused (", outcome.resync_reason,
                            "); its steps go with its next push"));
  }
  return true;
}

bool OuterStepHook::PushesAfter(int64_t t) const {
  return policy_->IsLast(t) || !policy_->DueAfter(t).empty();
}

uint64_t OuterStepHook::TokensSincePush(uint32_t f, int64_t t) const {
  if (auto counted = model_.TokensBetween(last_push_[f], t)) return *counted;
  return uint64_t(t - last_push_[f]) * uint64_t(options_.tokens_per_step);
}

void OuterStepHook::Push(uint32_t f, int64_t t, int64_t apply_at, double steps_per_s) {
  InFlight job;
  job.fragment = f;
  job.pushed_at = t;
  job.position = policy_->Position(t);
  job.apply_at = apply_at;
  job.bytes = compression::EncodedBytes(options_.island.sync.codec, syncs_[f]->global().size());
  job.averaging = policy_->WarmStartAfter(t);
  const uint64_t tokens = TokensSincePush(f, t);
  job.since = last_push_[f];
  last_push_[f] = t;
  policy_->Pushed(f, t);
  auto moments = std::make_shared<const MomentPush>(MomentsToPush(
      model_, *syncs_[f], options_.schedule.moment_sync_every, job.averaging));
  if (DeviceCopy* copy = model_.device_copy(f)) {
    // The pseudo-gradient is made on the device, in the compute stream's order; the task encodes it.
    const absl::Status captured = copy->Capture(options_.island.sync.error_feedback,
                                                  options_.island.sync.error_feedback_decay);
    job.result = std::async(std::launch::async, [sync = syncs_[f].get(), captured, tokens,
                                                 steps_per_s, t, moments] {
      return WithMoments(*sync, *moments, uint64_t(t), [&]() -> absl::StatusOr<RoundOutcome> {
        if (!captured.ok()) return captured;
        return sync->SyncRoundOnDevice(tokens, steps_per_s, uint64_t(t));
      });
    });
  } else {
    std::vector<float> local = model_.Snapshot(f);
    // Eager updates: until the round lands (tau > 0), the island trains on a stand-in for it.
    const std::vector<float>& global = syncs_[f]->global();
    job.eager = !eager_.empty() && apply_at > t && !job.averaging && !local.empty() &&
                local.size() == global.size();
    if (job.eager) model_.Merge(f, eager_[f].StandIn(global, local), 0.0);
    job.local = std::make_shared<const std::vector<float>>(std::move(local));
    job.tokens = tokens;
    job.steps_per_s = steps_per_s;
    job.result = std::async(std::launch::async, [sync = syncs_[f].get(), local = job.local,
                                                 tokens, steps_per_s, t, moments] {
      return WithMoments(*sync, *moments, uint64_t(t), [&] {
        return sync->SyncRound(*local, tokens, steps_per_s, uint64_t(t));
      });
    });
  }
  bytes_in_flight_ += job.bytes;
  stats_.peak_bytes_in_flight = std::max(stats_.peak_bytes_in_flight, bytes_in_flight_);
  in_flight_.push_back(std::move(job));
}

// A wait of more than a few seconds (a slower or stalled island) says what it waits for; an
// interruption (a Python island's Ctrl-C) ends it, the round still in flight.
absl::Status OuterStepHook::AwaitOldest() {
  const InFlight& job = in_flight_.front();
  const RetryPolicy& retry = options_.island.retry;
  const auto t0 = std::chrono::steady_clock::now();
  double said = 0;
  while (job.result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (retry.interrupted) ATL_RETURN_IF_ERROR(retry.interrupted());
    if (Since(t0) - said < retry.say_every_s) continue;
    said = Since(t0);
    session_.Say(absl::StrFormat(
        "waiting %.0f s for fragment %d's update from %s (pushed at step %d; a sync round "
        "commits once every member's push has arrived)",
        said, job.fragment, transport_.address().empty() ? "the service" : transport_.address(),
        job.pushed_at));
  }
  return absl::OkStatus();
}

absl::Status OuterStepHook::LandDue(int64_t t) {
  while (!in_flight_.empty() && in_flight_.front().apply_at <= t) {
    ATL_RETURN_IF_ERROR(Land(true));
  }
  return absl::OkStatus();
}

absl::Status OuterStepHook::LandAll(bool keep_local) {
  while (!in_flight_.empty()) {
    ATL_RETURN_IF_ERROR(Land(keep_local));
  }
  return absl::OkStatus();
}

// Waits for the oldest fragment in flight and merges its update.
absl::Status OuterStepHook::Land(bool keep_local) {
  const auto t0 = std::chrono::steady_clock::now();
  ATL_RETURN_IF_ERROR(AwaitOldest());
  InFlight job = std::move(in_flight_.front());
  in_flight_.pop_front();
  auto outcome = job.result.get();
  const double idle_s = Since(t0);
  bytes_in_flight_ -= job.bytes;
  const bool eager = job.eager;
  int64_t behind_steps = 0;
  ATL_RETURN_IF_ERROR(FollowFirstCarrier(job.fragment, outcome, behind_steps));
  const absl::Status& s = outcome.status();
  if (absl::IsPermissionDenied(s) || absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    // The service no longer counts this island as a member (declared dead while it was silent),
    // or is gone (restarting from its durable state, or the link is down): the island rejoins,
    // with retries, and pushes the contribution again then (sync, host path: on time if its round
    // is still open, else late), so that its steps still count.
    if (eager) eager_[job.fragment].Forget();
    if (!pending_rejoin_) pending_rejoin_ = s;
    if (job.local != nullptr && !options_.schedule.async) refused_.push_back(std::move(job));
    return absl::OkStatus();
  }
  if (!outcome.ok()) {
    return absl::Status(s.code(), absl::StrCat("outer round of fragment ", job.fragment, ": ",
                                               s.message()));
  }
  if (outcome->pushed_again > 0 && on_message && ranks_.rank() == 0) {
    on_message(absl::StrCat("fragment ", job.fragment, ": the service lost its push to round ",
                            outcome->round, " (it resumed from its durable state); pushed again"));
  }
  const std::vector<float>& global = syncs_[job.fragment]->global();
  keep_local = keep_local && !outcome->resynced && !job.averaging;
  if (eager && keep_local) {
    // The stand-in the island trained on since the push is swapped for the update.
    std::vector<float> local = model_.Snapshot(job.fragment);
    eager_[job.fragment].Land(global, outcome->contributors, local);
    model_.Merge(job.fragment, local, 0.0);
  } else if (!CarryRefused(job, *outcome)) {
    if (eager) eager_[job.fragment].Forget();
    model_.Merge(job.fragment, global, keep_local ? options_.island.alpha : 0.0);
  }
  if (LoadLandedMoments(model_, job.fragment, *outcome, on_message)) stats_.moment_rounds += 1;
  policy_->Landed(*outcome, model_, stats_);
  if (behind_steps > 0) policy_->FellBehind(job.position, double(behind_steps));
  if (options_.island.auto_tune) {
    ATL_RETURN_IF_ERROR(AdoptTau(outcome->tau));
  }
  stats_.tau = policy_->Delay();
  stats_.rounds += 1;
  stats_.resyncs += outcome->resynced ? 1 : 0;
  stats_.late_pushes += outcome->late ? 1 : 0;
  stats_.idle_s += idle_s;
  stats_.bytes_sent += outcome->bytes_sent;
  stats_.bytes_received += outcome->bytes_received;
  stats_.elements_synced += outcome->elements;
  if (observer_) {
    LandedRound landed;
    landed.fragment = job.fragment;
    landed.pushed_at = job.pushed_at;
    landed.step = model_.step();
    landed.idle_s = idle_s;
    landed.sync_every = policy_->sync_every();
    landed.tau = job.apply_at - job.pushed_at;
    landed.global_hash = syncs_[job.fragment]->global_hash();
    landed.range_hashes = RangeHashes(job.fragment);
    landed.outcome = *std::move(outcome);
    observer_(landed);
  }
  return absl::OkStatus();
}

absl::Status OuterStepHook::AdoptTau(int tau) {
  if (tau < 0 || tau == policy_->Delay()) return absl::OkStatus();
  if (tau >= int64_t(options_.schedule.sync_every)) {
    return absl::InvalidArgumentError(absl::StrCat("the service chose tau = ", tau,
                                                   ", not below H = ", options_.schedule.sync_every));
  }
  if (on_message) {
    on_message(absl::StrCat("auto-tune: tau ", policy_->Delay(), " -> ", tau,
                            " (the service's choice for this run's links)"));
  }
  policy_->SetDelay(tau);
  return absl::OkStatus();
}

absl::Status OuterStepHook::Finish(bool stopped) {
  if (stopped) return LeaveWithProgress();
  const auto t0 = std::chrono::steady_clock::now();
  ATL_RETURN_IF_ERROR(policy_->Finish(*this, stopped));
  stats_.idle_s += Since(t0);  // waiting for the other islands counts as idle
  return LandAll();
}

absl::Status OuterStepHook::CatchUp(const std::vector<uint64_t>& versions) {
  if (versions.size() != syncs_.size()) {
    return absl::DataLossError("the service's heartbeat names the wrong fragments");
  }
  for (uint32_t f = 0; f < syncs_.size(); ++f) {
    const uint64_t before = syncs_[f]->round();
    ATL_ASSIGN_OR_RETURN(auto caught, syncs_[f]->CatchUp(versions[f]));
    stats_.caught_up_rounds += syncs_[f]->round() > before ? syncs_[f]->round() - before : 0;
    stats_.bytes_received += caught.bytes_received;
    stats_.resyncs += caught.resynced ? 1 : 0;
    model_.Merge(f, syncs_[f]->global(), 0.0);
  }
  if (on_message) {
    on_message(absl::StrCat("finished: caught up with the run (", versions[0],
                            " commits of fragment 0)"));
  }
  return absl::OkStatus();
}

std::vector<OuterStepHook::Residual> OuterStepHook::Residuals() const {
  std::vector<Residual> out;
  for (const auto& sync : syncs_) {
    if (!sync->carried() || !sync->keeps_residual()) continue;
    out.push_back({sync->fragment(), sync->fragment_elements(), sync->ranges(),
                   sync->ResidualSnapshot()});
  }
  return out;
}

absl::Status OuterStepHook::RestoreResiduals(const std::vector<Residual>& from) {
  for (auto& sync : syncs_) {
    if (!sync->carried() || !sync->keeps_residual()) continue;
    std::vector<float> mine(sync->ResidualSnapshot().size(), 0.0f);
    bool any = false;
    uint64_t at = 0;
    for (const auto& [begin, end] : sync->ranges()) {
      for (const Residual& r : from) {
        if (r.fragment != sync->fragment() || r.fragment_elements != sync->fragment_elements()) continue;
        uint64_t theirs = 0;
        for (const auto& [b, e] : r.ranges) {
          const uint64_t lo = std::max(b, begin), hi = std::min(e, end);
          if (lo < hi && theirs + (e - b) <= r.values.size()) {
            std::copy(r.values.begin() + int64_t(theirs + (lo - b)),
                      r.values.begin() + int64_t(theirs + (hi - b)),
                      mine.begin() + int64_t(at + (lo - begin)));
            any = true;
          }
          theirs += e - b;
        }
      }
      at += end - begin;
    }
    if (any) ATL_RETURN_IF_ERROR(sync->RestoreResidual(std::move(mine)));
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
