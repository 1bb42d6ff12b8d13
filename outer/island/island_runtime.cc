#include "outer/island/island_runtime.h"

#include <chrono>

#include "compression/codec_math.h"
#include "compression/status_macros.h"

namespace atl::outer {

IslandRuntime::IslandRuntime(Transport& transport, IslandRanks& ranks, RuntimeOptions options,
                             std::unique_ptr<IslandSession> session)
    : transport_(transport),
      ranks_(ranks),
      options_(std::move(options)),
      session_(std::move(session)) {}

absl::StatusOr<std::unique_ptr<IslandRuntime>> IslandRuntime::Join(Transport& transport,
                                                                   IslandRanks& ranks,
                                                                   RuntimeOptions options) {
  // A coordinator that is restarting, or a run whose data streams are all held (by an island
  // whose lease has not expired yet), is retried with backoff and jitter.
  SessionOptions so = SessionOptionsOf(options.outer, options.name, options.model_hash,
                                       options.credential_file);
  so.parameters = options.parameters;
  so.data_parallel = options.data_parallel;
  so.say = options.say;
  so.retry.interrupted = options.interrupted;
  ATL_ASSIGN_OR_RETURN(auto session, IslandSession::JoinAsIsland(transport, so, ranks));
  // The session leaves the run if the island refuses it.
  ATL_RETURN_IF_ERROR(CheckRunMode(options.outer, session->joined().schedule()));
  return std::unique_ptr<IslandRuntime>(
      new IslandRuntime(transport, ranks, std::move(options), std::move(session)));
}

absl::Status IslandRuntime::Start(IslandModel& model, std::vector<FragmentShare> shares,
                                  StartOptions options) {
  const pb::JoinResponse& run = joined();
  OuterStepOptions o;
  o.schedule = ScheduleOf(run.schedule());
  // Islands round differently (stochastic rounding): the seed differs by data stream.
  o.island = IslandChoicesOf(options_.outer,
                             compression::math::Mix64(options_.seed) ^ run.data_stream());
  o.tokens_per_step = options.tokens_per_step;
  o.island.retry.interrupted = options_.interrupted;
  hook_ = std::make_unique<OuterStepHook>(transport_, *session_, ranks_, model,
                                          std::move(shares), o);
  if (options.resumed) {
    // What error feedback had not yet sent carries on from the checkpoint.
    ATL_RETURN_IF_ERROR(hook_->RestoreResiduals(options.residuals));
  }
  const auto fetch_start = std::chrono::steady_clock::now();
  ATL_RETURN_IF_ERROR(hook_->FetchGlobal());
  if (options.after_fetch) ATL_RETURN_IF_ERROR(options.after_fetch());
  fetch_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - fetch_start).count();
  if (async() && run.round() == 0 && ranks_.rank() == 0) {
    // Async islands start together: otherwise the first island up could spend the run's whole
    // token budget before the others have started.
    ATL_RETURN_IF_ERROR(session_->WaitForPeers());
  }
  // Every rank is ready before the heartbeats say the island trains.
  ATL_RETURN_IF_ERROR(ranks_.Any(false).status());
  session_->StartHeartbeats();
  return absl::OkStatus();
}

absl::Status IslandRuntime::Finish(bool stopped, const std::function<absl::Status()>& before_leave) {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  absl::Status s = hook_ != nullptr ? hook_->Finish(stopped) : absl::OkStatus();
  if (s.ok() && before_leave) s = before_leave();
  // The last telemetry (an evaluation, the final figures) reaches the service before the island
  // leaves: the heartbeats may not have carried it yet.
  if (session_->leads()) session_->Heartbeat(false).IgnoreError();
  session_->Leave();
  return s;
}

void IslandRuntime::Abandon() {
  if (!finished_) {
    finished_ = true;
    session_->Leave();
  }
  transport_.Cancel();
}

}  // namespace atl::outer
