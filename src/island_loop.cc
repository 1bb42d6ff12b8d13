#include "src/island_loop.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <future>
#include <map>
#include <filesystem>
#include <thread>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "compression/codec_math.h"
#include "inner/loss_guard.h"
#include "outer/fragments.h"
#include "outer/island_sync.h"
#include "outer/names.h"
#include "src/checkpoint.h"
#include "src/flat_params.h"
#include "src/metrics.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Calls `f` until it succeeds, fails for good, or `timeout_s` has passed; UNAVAILABLE (no
// coordinator) and RESOURCE_EXHAUSTED (no free data stream yet) are retried after 0.2 s, 0.4 s, ...
// (at most 5 s), each with up to 50% random jitter so that islands do not retry in lockstep.
template <typename F>
auto WithRetries(double timeout_s, F&& f) -> decltype(f()) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::mt19937_64 rng(std::random_device{}());
  double backoff = 0.2;
  while (true) {
    auto r = f();
    const bool transient =
        absl::IsUnavailable(r.status()) || absl::IsResourceExhausted(r.status());
    if (r.ok() || !transient || Clock::now() > until) return r;
    const double wait = backoff * (1.0 + 0.5 * std::uniform_real_distribution<double>()(rng));
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    backoff = std::min(backoff * 2, 5.0);
  }
}

// Renews the island's lease every `period_s` from its own thread, so that long inner steps or a
// slow round never look like silence. Remembers the first refusal (the service declared the
// island dead, or restarted without it): the training thread then rejoins.
class HeartbeatThread {
 public:
  HeartbeatThread(outer::Transport& transport, pb::HeartbeatRequest request,
                  std::shared_ptr<const outer::IslandIdentity> identity, double period_s)
      : transport_(transport),
        request_(std::move(request)),
        identity_(std::move(identity)),
        period_s_(period_s) {
    thread_ = std::thread([this] { Run(); });
  }
  ~HeartbeatThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void set_step(int64_t step) { step_ = step; }
  // The refusal since the last call, if any.
  std::optional<absl::Status> TakeRefusal() {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = std::move(refusal_);
    refusal_.reset();
    return r;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(period_s_), [&] { return stop_; })) {
      pb::HeartbeatRequest request = request_;
      request.set_inner_step(uint64_t(step_.load()));
      request.set_session(identity_->session());
      lock.unlock();
      auto r = transport_.Heartbeat(request);
      lock.lock();
      if (!r.ok() && (absl::IsNotFound(r.status()) || absl::IsPermissionDenied(r.status()))) {
        refusal_ = r.status();
      }
    }
  }

  outer::Transport& transport_;
  const pb::HeartbeatRequest request_;
  const std::shared_ptr<const outer::IslandIdentity> identity_;
  const double period_s_;
  std::atomic<int64_t> step_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<absl::Status> refusal_;
  std::thread thread_;
};

// Passes every step on and remembers the last loss, for the spike guard.
class LossWatch : public inner::LoopObserver {
 public:
  explicit LossWatch(inner::LoopObserver& next) : next_(next) {}
  absl::Status OnStep(const inner::StepStats& step, const inner::EvalStats* eval) override {
    loss = step.loss;
    return next_.OnStep(step, eval);
  }
  double loss = 0;

 private:
  inner::LoopObserver& next_;
};

}  // namespace

absl::StatusOr<IslandSummary> RunIsland(const Config& config, outer::Transport& transport,
                                        const IslandOptions& options) {
  // Everything that can be checked locally is checked before joining.
  if (auto s = outer::ValidateName(options.name, "island name (--name)"); !s.ok()) return s;
  auto data = inner::LoadDataset(config.data, config.model.context, config.model.vocab);
  if (!data.ok()) return data.status();
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  std::optional<Checkpoint> resumed;
  if (options.resume) {
    // The island's own state (AdamW moments, data cursor, RNG) comes back from its newest
    // checkpoint; the global parameters come from the service, as for any join.
    auto latest = LatestCheckpoint(options.run_dir);
    if (!latest.ok()) return latest.status();
    auto ckpt = ReadCheckpoint(*latest);
    if (!ckpt.ok()) return ckpt.status();
    resumed = *std::move(ckpt);
  } else if (fs::exists(fs::path(options.run_dir) / "metrics.jsonl")) {
    return absl::AlreadyExistsError(absl::StrCat("run directory ", options.run_dir,
                                                 " already holds an island's run (--resume "
                                                 "continues it)"));
  }

  pb::JoinRequest join;
  join.set_run_id(config.outer.run_id);
  join.set_name(options.name);
  join.set_config_hash(ModelConfigHash(config.model));
  // A coordinator that is restarting, or a run whose data streams are all held (by an island
  // whose lease has not expired yet), is retried with exponential backoff and jitter.
  auto join_with_retries = [&]() -> absl::StatusOr<pb::JoinResponse> {
    return WithRetries(config.outer.reconnect_timeout_s, [&] { return transport.Join(join); });
  };
  auto joined = join_with_retries();
  if (!joined.ok()) {
    return absl::Status(joined.status().code(),
                        absl::StrCat("joining run '", config.outer.run_id, "': ",
                                     joined.status().message()));
  }
  const std::string island_id = joined->island_id();
  const uint32_t data_stream = joined->data_stream();
  auto identity = std::make_shared<outer::IslandIdentity>(island_id, joined->session());
  std::unique_ptr<HeartbeatThread> heartbeats;
  auto leave = [&] {
    heartbeats.reset();  // no lease renewals after the goodbye
    pb::LeaveRequest l;
    l.set_run_id(config.outer.run_id);
    l.set_island_id(island_id);
    l.set_session(identity->session());
    transport.Leave(l).IgnoreError();  // best effort: the service also drops silent islands
  };
  if (joined->config_hash() != ModelConfigHash(config.model)) {  // the service checks it too
    leave();
    return absl::FailedPreconditionError(
        "this island's [model] config differs from the coordinator's: both must build the same "
        "model");
  }
  const auto& schedule = joined->schedule();
  const bool async = schedule.async();
  if (async != config.outer.async()) {
    leave();
    return absl::FailedPreconditionError(absl::StrCat(
        "this island is configured for outer.mode = \"", config.outer.mode,
        "\" but the run is ", async ? "async" : "sync"));
  }
  if (!(options.throttle >= 1)) {
    leave();
    return absl::InvalidArgumentError(
        absl::StrCat("--throttle must be a factor >= 1, got ", options.throttle));
  }
  inner::TrainConfig train = config.train;
  train.steps = int64_t(schedule.total_inner_steps());
  const int64_t h = int64_t(schedule.sync_every());
  auto trainer = inner::Trainer::Create(config.model, config.optim, train, *data,
                                        int(joined->data_stream()),
                                        int(schedule.num_data_streams()));
  if (!trainer.ok()) {
    leave();
    return trainer.status();
  }
  if (resumed) {
    if (auto s = (*trainer)->ImportState(resumed->state); !s.ok()) {
      leave();
      return s;
    }
  }
  if (!async && joined->round() > 0) {
    // A late joiner takes part from the run's current round: its step count (and so its
    // learning-rate schedule and its last step) line up with the other islands'.
    (*trainer)->SetStep(int64_t(joined->round()) * h);
    if (!resumed && config.outer.join_warmup_steps > 0) {
      (*trainer)->RampLearningRate(config.outer.join_warmup_steps);
    }
  }
  const NamedParams params = inner::NamedParameters(*(*trainer)->model());
  const auto layout = LayoutOf(params);
  // The service's fragments, as indices into this model's parameters.
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < layout.names.size(); ++i) index_of[layout.names[i]] = i;
  std::vector<std::vector<size_t>> fragments;
  size_t covered = 0;
  for (const auto& f : joined->fragments()) {
    std::vector<size_t> indices;
    for (const auto& name : f.parameters()) {
      auto it = index_of.find(name);
      if (it == index_of.end()) {
        leave();
        return absl::FailedPreconditionError(
            absl::StrCat("the service's parameter '", name, "' is not in this model"));
      }
      indices.push_back(it->second);
    }
    covered += indices.size();
    fragments.push_back(std::move(indices));
  }
  if (covered != layout.names.size() || fragments.size() != schedule.num_fragments()) {
    leave();
    return absl::FailedPreconditionError("the service's parameter layout differs from this model's");
  }
  const uint32_t num_fragments = uint32_t(fragments.size());

  outer::IslandSyncOptions sync_options;
  sync_options.codec = *compression::ParseCodec(config.outer.codec);  // validated with the config
  sync_options.error_feedback = config.outer.error_feedback;
  sync_options.stochastic_rounding = config.outer.stochastic_rounding;
  sync_options.seed = compression::math::Mix64(config.train.seed) ^ joined->data_stream();
  sync_options.async = async;
  std::vector<std::unique_ptr<outer::IslandSync>> syncs;
  const auto fetch_start = Clock::now();
  for (uint32_t f = 0; f < num_fragments; ++f) {
    sync_options.fragment = f;
    uint64_t n = 0;
    for (size_t i : fragments[f]) n += layout.numels[i];
    syncs.push_back(std::make_unique<outer::IslandSync>(&transport, config.outer.run_id, identity,
                                                        n, sync_options));
    // A coordinator that restarts right now is waited for, as for the join itself.
    auto fetched = WithRetries(config.outer.reconnect_timeout_s, [&]() -> absl::StatusOr<bool> {
      if (auto s = syncs[f]->FetchGlobal(); !s.ok()) return s;
      return true;
    });
    if (!fetched.ok()) {
      leave();
      return fetched.status();
    }
    LoadFlat(syncs[f]->global(), params, fragments[f]);
  }
  const double fetch_s = Since(fetch_start);
  uint64_t fetched = 0;
  for (const auto& s : syncs) fetched += s->fetched_bytes();

  {
    pb::HeartbeatRequest beat;
    beat.set_run_id(config.outer.run_id);
    beat.set_island_id(island_id);
    beat.set_session(identity->session());
    if (async && joined->round() == 0) {
      // Async islands start together, as sync ones do in their first round: otherwise the first
      // island up could spend the run's whole token budget before the others have started.
      const auto until = Clock::now() + std::chrono::duration<double>(config.outer.reconnect_timeout_s);
      while (true) {
        auto state = transport.Heartbeat(beat);
        if (!state.ok()) {
          leave();
          return state.status();
        }
        if (state->training_members() >= schedule.num_data_streams() || state->round() > 0 ||
            Clock::now() > until) {
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    heartbeats = std::make_unique<HeartbeatThread>(transport, beat, identity,
                                                   config.outer.heartbeat_s);
  }
  std::error_code ec;
  fs::create_directories(fs::path(options.run_dir) / "checkpoints", ec);
  WriteFileAtomic((fs::path(options.run_dir) / "config.toml").string(), ToToml(config))
      .IgnoreError();
  auto metrics = MetricsLog::Open((fs::path(options.run_dir) / "metrics.jsonl").string(),
                                  resumed ? resumed->state.step : 0);
  if (!metrics.ok()) {
    leave();
    return metrics.status();
  }
  const std::string label = absl::StrCat("[", island_id, "] ");
  Progress progress(options.progress, options.tty, train.steps, config.run.log_every, label);
  const int tau = config.outer.fragment_sync_delay;
  const double alpha = config.outer.alpha();
  if (resumed) {
    progress.Message(absl::StrFormat("%sresumed from its checkpoint of step %d (AdamW moments, "
                                     "data cursor, RNG); global parameters from the service",
                                     label, resumed->state.step));
  }
  progress.Message(absl::StrFormat(
      "%sjoined %s run '%s' at %s %d: data stream %d of %d, H = %d, %d fragment(s), tau = %d, "
      "alpha = %.2f, %s, %s, %.2fM parameters (state: %.1f MiB in %.2fs)%s",
      label, async ? "async" : "sync", config.outer.run_id, async ? "version" : "round",
      syncs[0]->round(), joined->data_stream(), schedule.num_data_streams(), h, num_fragments, tau,
      alpha, config.outer.codec,
      async ? absl::StrCat("until the run has trained ", schedule.token_budget(), " tokens")
            : absl::StrCat(train.steps, " inner steps"),
      double(layout.total()) / 1e6, double(fetched) / 1048576.0, fetch_s,
      options.throttle > 1 ? absl::StrFormat(", throttled %.1fx", options.throttle) : ""));

  // Training thread: inner steps, snapshots of due fragments, merges. Communication: one task per
  // fragment in flight, which owns that fragment's IslandSync until the training thread waits for
  // it; live parameters are only touched here.
  struct InFlight {
    uint32_t fragment;
    int64_t pushed_at;  // inner step of the snapshot
    int64_t apply_at;   // inner step after which the update is merged
    uint64_t bytes;     // encoded payload, counted while in flight
    std::future<absl::StatusOr<outer::RoundOutcome>> result;
  };
  std::deque<InFlight> in_flight;
  const outer::SyncSchedule sync_schedule{int(h), int(num_fragments)};
  std::vector<int64_t> last_push(num_fragments, (*trainer)->step());
  const auto start = Clock::now();
  StepReporter reporter(**metrics, progress);
  LossWatch watch(reporter);
  inner::LossSpikeGuard guard(config.outer.spike_window, config.outer.spike_factor);
  IslandSummary summary;
  summary.island_id = island_id;
  uint64_t bytes_in_flight = 0;
  // Async mode: each fragment's next sync step (H follows the island's throughput), whether the
  // run's token budget is spent, and the run's tokens as of the last answer.
  int64_t h_now = h;
  std::vector<int64_t> next_due(num_fragments);
  for (uint32_t f = 0; f < num_fragments; ++f) {
    next_due[f] = sync_schedule.offset(int(f)) > 0 ? sync_schedule.offset(int(f)) : h;
  }
  bool finishing = false;
  uint64_t run_tokens = 0;
  std::optional<absl::Status> pending_rejoin;
  // Joins again under the same name (asking for the same data stream) and loads the global state.
  auto rejoin = [&]() -> absl::Status {
    progress.Message(absl::StrCat(label, "rejoining the run: ", pending_rejoin->message()));
    join.set_preferred_data_stream(data_stream + 1);
    auto again = join_with_retries();
    if (absl::IsAlreadyExists(again.status())) {
      // Still a member (the service was only slow): fetching the state is enough.
    } else if (!again.ok()) {
      return again.status();
    } else {
      identity->set_session(again->session());
    }
    if (again.ok() && again->data_stream() != data_stream) {
      progress.Message(absl::StrFormat(
          "%swarning: its data stream %d was taken meanwhile (the service assigned %d); this "
          "island goes on reading stream %d",
          label, data_stream, again->data_stream(), data_stream));
    }
    for (uint32_t f = 0; f < num_fragments; ++f) {
      if (auto s = syncs[f]->FetchGlobal(); !s.ok()) return s;
      LoadFlat(syncs[f]->global(), params, fragments[f], 0.0);
    }
    pending_rejoin.reset();
    summary.rejoins += 1;
    if (!async) {
      // Back in step with the run (the service may have lost rounds this island had done).
      (*trainer)->SetStep(int64_t(syncs[0]->round()) * h);
      std::fill(last_push.begin(), last_push.end(), (*trainer)->step());
    }
    progress.Message(absl::StrFormat("%srejoined at round %d", label, syncs[0]->round()));
    return absl::OkStatus();
  };

  // Waits for the oldest fragment in flight and merges its update.
  auto land = [&](double merge_alpha) -> absl::Status {
    InFlight job = std::move(in_flight.front());
    in_flight.pop_front();
    const auto t0 = Clock::now();
    auto outcome = job.result.get();
    const double idle_s = Since(t0);
    bytes_in_flight -= job.bytes;
    if (!outcome.ok() && (absl::IsPermissionDenied(outcome.status()) ||
                          absl::IsUnavailable(outcome.status()) ||
                          absl::IsDeadlineExceeded(outcome.status()))) {
      // The service no longer counts this island as a member (declared dead while it was
      // silent), or is gone (restarting from its durable state): the contribution is lost; the
      // island rejoins, with retries, and loads the global state before its next push.
      if (!pending_rejoin) pending_rejoin = outcome.status();
      return absl::OkStatus();
    }
    if (!outcome.ok()) {
      return absl::Status(outcome.status().code(),
                          absl::StrCat("outer round of fragment ", job.fragment, ": ",
                                       outcome.status().message()));
    }
    auto& sync = *syncs[job.fragment];
    LoadFlat(sync.global(), params, fragments[job.fragment], outcome->resynced ? 0.0 : merge_alpha);
    if (async) {
      if (outcome->sync_every > 0) h_now = outcome->sync_every;
      finishing |= outcome->budget_reached;
      if (outcome->tokens_committed > run_tokens && schedule.token_budget() > 0) {
        run_tokens = outcome->tokens_committed;
        // The learning rate follows the run's progress, not this island's step count.
        (*trainer)->SetSchedulePosition(int64_t(double(run_tokens) /
                                                double(schedule.token_budget()) *
                                                double(train.steps)));
      }
      summary.staleness.push_back(outcome->staleness);
    }
    summary.rounds += 1;
    summary.resyncs += outcome->resynced ? 1 : 0;
    summary.sync_s += idle_s;
    summary.bytes_sent += outcome->bytes_sent;
    summary.bytes_received += outcome->bytes_received;
    const int64_t step = (*trainer)->step();
    nlohmann::json record = {{"round", outcome->round},
                             {"fragment", job.fragment},
                             {"step", step},
                             {"pushed_at", job.pushed_at},
                             {"tokens", (*trainer)->tokens()},
                             {"wall_s", Since(start)},
                             {"idle_s", idle_s},
                             {"push_s", outcome->push_s},
                             {"wait_s", outcome->wait_s},
                             {"bytes_sent", outcome->bytes_sent},
                             {"bytes_received", outcome->bytes_received},
                             {"contributors", outcome->contributors},
                             {"version", outcome->version},
                             {"staleness", outcome->staleness},
                             {"sync_every", async ? h_now : h},
                             {"global_hash", absl::StrFormat("%016x", sync.global_hash())},
                             {"resynced", outcome->resynced}};
    (*metrics)->Write(record);
    std::string line =
        async ? absl::StrFormat(
                    "%sfragment %d now at version %d, merged at step %d (pushed at %d): staleness "
                    "%d, idle %.2fs, sent %d KiB, next H %d",
                    label, job.fragment, outcome->version, step, job.pushed_at,
                    outcome->staleness, idle_s, outcome->bytes_sent / 1024, h_now)
              : absl::StrFormat(
                    "%sfragment %d round %d merged at step %d (pushed at %d): idle %.2fs, sent %s, "
                    "%d contributors",
                    label, job.fragment, outcome->round + 1, step, job.pushed_at, idle_s,
                    absl::StrCat(outcome->bytes_sent / 1024, " KiB"), outcome->contributors);
    if (outcome->resynced) line += " (resynced: " + outcome->resync_reason + ")";
    progress.Message(line);
    return absl::OkStatus();
  };
  auto fail = [&](absl::Status s) {
    while (!in_flight.empty()) in_flight.front().result.wait(), in_flight.pop_front();
    leave();
    return s;
  };

  // Checkpoints: the training thread copies the island's state to CPU memory (the only stall) and
  // a background task writes it (temp file, fsync, rename) while training goes on.
  std::future<absl::Status> checkpoint_write;
  auto save_checkpoint = [&](bool background) -> absl::Status {
    if (checkpoint_write.valid()) {
      if (auto s = checkpoint_write.get(); !s.ok()) {
        progress.Message(absl::StrCat(label, "warning: checkpoint not written: ", s.message()));
      }
    }
    const auto t0 = Clock::now();
    inner::TrainerState state = (*trainer)->ExportState();
    const double stall = Since(t0);
    summary.checkpoints += 1;
    summary.checkpoint_stall_max_s = std::max(summary.checkpoint_stall_max_s, stall);
    auto write = [path = CheckpointPath(options.run_dir, state.step), state = std::move(state),
                  meta = CheckpointMeta{Since(start), ToToml(config)}, dir = options.run_dir,
                  keep = config.run.checkpoint_keep] {
      auto s = WriteCheckpoint(path, state, meta);
      if (s.ok()) PruneCheckpoints(dir, keep);
      return s;
    };
    if (!background) return write();
    checkpoint_write = std::async(std::launch::async, std::move(write));
    return absl::OkStatus();
  };
  auto evaluate = [&](int64_t t) {
    const auto eval = (*trainer)->Evaluate();
    summary.last_eval = eval;
    nlohmann::json record = {{"step", t}, {"tokens", (*trainer)->tokens()},
                             {"wall_s", Since(start)}, {"val_loss", eval.loss},
                             {eval.per_byte ? "val_bpb" : "val_bits_per_token", eval.bits}};
    if (async) record["run_tokens"] = run_tokens;
    (*metrics)->Write(record);
    progress.Message(absl::StrFormat("%sstep %d | val_loss %.4f", label, t, eval.loss));
  };
  // Async islands train until the run's token budget is spent (bounded by the whole budget).
  const int64_t max_steps = async ? train.steps * int64_t(schedule.num_data_streams()) : train.steps;
  while ((*trainer)->step() < max_steps) {
    const auto t0 = Clock::now();
    if (auto s = inner::RunLoop(**trainer, (*trainer)->step() + 1, watch, /*evaluate=*/false);
        !s.ok()) {
      return fail(s);
    }
    if (auto spike = guard.Check(watch.loss)) {
      // The local parameters since the last sync are not to be trusted: drop them (and, for a
      // non-finite loss, the AdamW moments they poisoned) and go on from the global parameters.
      // The next push carries only the steps after this one (weighted, as always, by the tokens
      // trained since the last push).
      for (uint32_t f = 0; f < num_fragments; ++f) {
        LoadFlat(syncs[f]->global(), params, fragments[f], 0.0);
      }
      if (!std::isfinite(watch.loss)) (*trainer)->optimizer().Reset();
      summary.spikes += 1;
      progress.Message(absl::StrFormat("%sstep %d: %s; reloaded the global parameters", label,
                                       (*trainer)->step(), *spike));
    }
    if (options.throttle > 1) {
      // A slower island, honestly: the step takes `throttle` times as long in wall-clock time.
      std::this_thread::sleep_for(std::chrono::duration<double>(Since(t0) * (options.throttle - 1)));
    }
    summary.compute_s += Since(t0);
    summary.steps_trained += 1;
    const int64_t t = (*trainer)->step();
    heartbeats->set_step(t);
    if (!pending_rejoin) pending_rejoin = heartbeats->TakeRefusal();
    if (pending_rejoin) {
      while (!in_flight.empty()) {
        if (auto s = land(0.0); !s.ok()) return fail(s);
      }
      if (auto s = rejoin(); !s.ok()) return fail(s);
    }
    const bool last = async ? (finishing || t == max_steps) : t == train.steps;
    // Merge what is due (tau steps after its push), then push the fragments due now.
    while (!in_flight.empty() && in_flight.front().apply_at <= t) {
      if (auto s = land(alpha); !s.ok()) return fail(s);
    }
    auto push = [&](uint32_t f, int64_t apply_at) {
      InFlight job;
      job.fragment = f;
      job.pushed_at = t;
      job.apply_at = apply_at;
      job.bytes = compression::EncodedBytes(sync_options.codec, syncs[f]->global().size());
      const uint64_t tokens = uint64_t(t - last_push[f]) * uint64_t((*trainer)->tokens_per_step());
      last_push[f] = t;
      next_due[f] = t + h_now;
      const double steps_per_s = double(t) / std::max(1e-9, summary.compute_s);
      job.result = std::async(std::launch::async, [sync = syncs[f].get(),
                                                   local = Flatten(params, fragments[f]), tokens,
                                                   steps_per_s] {
        return sync->SyncRound(local, tokens, steps_per_s);
      });
      bytes_in_flight += job.bytes;
      summary.peak_bytes_in_flight = std::max(summary.peak_bytes_in_flight, bytes_in_flight);
      in_flight.push_back(std::move(job));
    };
    if (!last && async) {
      // A fragment lands before its next push: tau stays below the island's current H.
      const int64_t delay = std::min<int64_t>(tau, h_now - 1);
      for (uint32_t f = 0; f < num_fragments; ++f) {
        if (next_due[f] <= t) push(f, t + delay);
      }
      while (!in_flight.empty() && in_flight.front().apply_at <= t) {
        if (auto s = land(alpha); !s.ok()) return fail(s);
      }
    } else if (!last) {
      for (uint32_t f : sync_schedule.DueAfter(t)) push(f, t + tau);
      while (!in_flight.empty() && in_flight.front().apply_at <= t) {  // tau = 0: blocking
        if (auto s = land(alpha); !s.ok()) return fail(s);
      }
    } else {
      // The run ends synced: everything in flight lands, then each fragment is pushed and merged
      // in turn (alpha 0: the island ends on the global parameters).
      while (!in_flight.empty()) {
        if (auto s = land(0.0); !s.ok()) return fail(s);
      }
      for (uint32_t f = 0; f < num_fragments; ++f) {
        push(f, t);
        if (auto s = land(0.0); !s.ok()) return fail(s);
      }
    }
    const int64_t every = train.eval_every;
    // Async islands evaluate the run's final parameters once every island has finished (below).
    if ((every > 0 && t % every == 0 && !last) || (last && !async)) evaluate(t);
    const int64_t ckpt_every = config.run.checkpoint_every;
    if (ckpt_every > 0 && t % ckpt_every == 0 && !last) {
      if (auto s = save_checkpoint(/*background=*/true); !s.ok()) return fail(s);
    }
    if (options.stop != nullptr && options.stop->load()) break;
    if (last) break;
  }
  if (async && (options.stop == nullptr || !options.stop->load())) {
    // Every island ends on the run's final parameters: say this island has finished, wait until
    // every other one has too, then apply the versions committed since, checking every hash.
    const auto t0 = Clock::now();
    pb::HeartbeatRequest beat;
    beat.set_run_id(config.outer.run_id);
    beat.set_island_id(island_id);
    beat.set_session(identity->session());
    beat.set_inner_step(uint64_t((*trainer)->step()));
    beat.set_finished(true);
    const auto until = t0 + std::chrono::duration<double>(config.outer.round_timeout_s);
    absl::StatusOr<pb::HeartbeatResponse> state;
    while (true) {
      state = transport.Heartbeat(beat);
      if (!state.ok()) return fail(state.status());
      if (state->training_members() == 0 || Clock::now() > until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (state->versions_size() != int(num_fragments)) {
      return fail(absl::DataLossError("the service's heartbeat names the wrong fragments"));
    }
    for (uint32_t f = 0; f < num_fragments; ++f) {
      auto caught = syncs[f]->CatchUp(state->versions(int(f)));
      if (!caught.ok()) return fail(caught.status());
      summary.bytes_received += caught->bytes_received;
      summary.resyncs += caught->resynced ? 1 : 0;
      LoadFlat(syncs[f]->global(), params, fragments[f], 0.0);
    }
    summary.sync_s += Since(t0);
    progress.Message(absl::StrFormat("%sfinished: caught up with version %d of the run after %.1fs",
                                     label, state->versions(0), Since(t0)));
    evaluate((*trainer)->step());
  }
  while (!in_flight.empty()) {
    if (auto s = land(0.0); !s.ok()) return fail(s);
  }
  // The last checkpoint is written before the island says it is done.
  if (auto s = save_checkpoint(/*background=*/false); !s.ok()) {
    progress.Message(absl::StrCat(label, "warning: final checkpoint not written: ", s.message()));
  }
  const std::vector<float> all_global = [&] {
    std::vector<float> g;
    for (const auto& s : syncs) g.insert(g.end(), s->global().begin(), s->global().end());
    return g;
  }();
  progress.Finish();
  leave();
  summary.step = (*trainer)->step();
  summary.tokens = (*trainer)->tokens();
  summary.wall_s = Since(start);
  summary.global_hash = compression::Checksum(all_global.data(), all_global.size() * sizeof(float));
  nlohmann::json s = {{"island_id", island_id},
                      {"step", summary.step},
                      {"tokens", summary.tokens},
                      {"rounds", summary.rounds},
                      {"resyncs", summary.resyncs},
                      {"rejoins", summary.rejoins},
                      {"spikes", summary.spikes},
                      {"checkpoints", summary.checkpoints},
                      {"checkpoint_stall_ms", 1e3 * summary.checkpoint_stall_max_s},
                      {"steps_trained", summary.steps_trained},
                      {"step_ms", 1e3 * summary.compute_s /
                                      std::max<double>(1, double(summary.steps_trained))},
                      {"wall_s", summary.wall_s},
                      {"compute_s", summary.compute_s},
                      {"sync_s", summary.sync_s},
                      {"bytes_sent", summary.bytes_sent},
                      {"bytes_received", summary.bytes_received},
                      {"peak_bytes_in_flight", summary.peak_bytes_in_flight},
                      {"utilization", summary.compute_s / std::max(1e-9, summary.wall_s)},
                      {"throttle", options.throttle},
                      {"global_hash", absl::StrFormat("%016x", summary.global_hash)}};
  if (summary.last_eval) s["val_loss"] = summary.last_eval->loss;
  if (async) {
    s["staleness"] = summary.staleness;
    s["run_tokens"] = run_tokens;
  }
  WriteFileAtomic((fs::path(options.run_dir) / "summary.json").string(), s.dump(2) + "\n")
      .IgnoreError();
  return summary;
}

}  // namespace atl
