#include "src/island_loop.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "compression/codec_math.h"
#include "inner/loss_guard.h"
#include "outer/island_session.h"
#include "outer/names.h"
#include "outer/outer_step.h"
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

// The trainer as the outer step sees it: each fragment is a list of the model's parameters.
class TrainerModel : public outer::IslandModel {
 public:
  TrainerModel(inner::Trainer& trainer, std::vector<std::vector<size_t>> fragments)
      : trainer_(trainer),
        params_(inner::NamedParameters(*trainer.model())),
        fragments_(std::move(fragments)) {}

  int64_t step() const override { return trainer_.step(); }
  std::vector<float> Snapshot(uint32_t f) override { return Flatten(params_, fragments_[f]); }
  void Merge(uint32_t f, const std::vector<float>& global, double alpha) override {
    LoadFlat(global, params_, fragments_[f], alpha);
  }
  void JumpToStep(int64_t step) override { trainer_.SetStep(step); }
  void FollowRunProgress(int64_t position) override { trainer_.SetSchedulePosition(position); }

  std::vector<uint64_t> FragmentSizes() const {
    const auto layout = LayoutOf(params_);
    std::vector<uint64_t> sizes;
    for (const auto& f : fragments_) {
      uint64_t n = 0;
      for (size_t i : f) n += layout.numels[i];
      sizes.push_back(n);
    }
    return sizes;
  }

 private:
  inner::Trainer& trainer_;
  const NamedParams params_;
  const std::vector<std::vector<size_t>> fragments_;
};

// The service's fragments, as indices into this model's parameters.
absl::StatusOr<std::vector<std::vector<size_t>>> ResolveFragments(const pb::JoinResponse& joined,
                                                                  const outer::FragmentLayout& layout) {
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < layout.names.size(); ++i) index_of[layout.names[i]] = i;
  std::vector<std::vector<size_t>> fragments;
  size_t covered = 0;
  for (const auto& f : joined.fragments()) {
    std::vector<size_t> indices;
    for (const auto& name : f.parameters()) {
      auto it = index_of.find(name);
      if (it == index_of.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the service's parameter ", outer::Printable(name), " is not in this model"));
      }
      indices.push_back(it->second);
    }
    covered += indices.size();
    fragments.push_back(std::move(indices));
  }
  if (covered != layout.names.size() ||
      fragments.size() != joined.schedule().num_fragments()) {
    return absl::FailedPreconditionError("the service's parameter layout differs from this model's");
  }
  return fragments;
}

// What the service says of the run must match what this island was started with.
absl::Status CheckRunMatches(const Config& config, const pb::JoinResponse& joined,
                             const IslandOptions& options) {
  if (joined.config_hash() != ModelConfigHash(config.model)) {  // the service checks it too
    return absl::FailedPreconditionError(
        "this island's [model] config differs from the coordinator's: both must build the same "
        "model");
  }
  if (joined.schedule().async() != config.outer.async()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this island is configured for outer.mode = \"", config.outer.mode, "\" but the run is ",
        joined.schedule().async() ? "async" : "sync"));
  }
  if (!(options.throttle >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--throttle must be a factor >= 1, got ", options.throttle));
  }
  return absl::OkStatus();
}

// The island's own state (AdamW moments, data cursor, RNG) from its newest checkpoint; the global
// parameters come from the service, as for any join.
absl::StatusOr<std::optional<Checkpoint>> LoadResumeState(const IslandOptions& options) {
  if (options.resume) {
    auto latest = LatestCheckpoint(options.run_dir);
    if (!latest.ok()) return latest.status();
    auto ckpt = ReadCheckpoint(*latest);
    if (!ckpt.ok()) return ckpt.status();
    return std::optional<Checkpoint>(*std::move(ckpt));
  }
  if (fs::exists(fs::path(options.run_dir) / "metrics.jsonl")) {
    return absl::AlreadyExistsError(absl::StrCat("run directory ", options.run_dir,
                                                 " already holds an island's run (--resume "
                                                 "continues it)"));
  }
  return std::optional<Checkpoint>();
}

// The trainer on the island's data stream, at the run's step for a late joiner.
absl::StatusOr<std::unique_ptr<inner::Trainer>> MakeTrainer(
    const Config& config, const inner::TrainConfig& train, const pb::JoinResponse& joined,
    std::shared_ptr<const inner::Dataset> data, const std::optional<Checkpoint>& resumed) {
  auto trainer = inner::Trainer::Create(config.model, config.optim, train, std::move(data),
                                        int(joined.data_stream()),
                                        int(joined.schedule().num_data_streams()));
  if (!trainer.ok()) return trainer.status();
  if (resumed) {
    if (auto s = (*trainer)->ImportState(resumed->state); !s.ok()) return s;
  }
  if (!joined.schedule().async() && joined.round() > 0) {
    // A late joiner takes part from the run's current round: its step count (and so its
    // learning-rate schedule and its last step) line up with the other islands'.
    (*trainer)->SetStep(int64_t(joined.round()) * int64_t(joined.schedule().sync_every()));
    if (!resumed && config.outer.join_warmup_steps > 0) {
      (*trainer)->RampLearningRate(config.outer.join_warmup_steps);
    }
  }
  return trainer;
}

outer::OuterStepOptions OuterOptions(const Config& config, const pb::JoinResponse& joined,
                                     const inner::Trainer& trainer) {
  const auto& schedule = joined.schedule();
  outer::OuterStepOptions o;
  o.total_steps = int64_t(schedule.total_inner_steps());
  o.sync_every = schedule.sync_every();
  o.tau = config.outer.fragment_sync_delay;
  o.alpha = config.outer.alpha();
  o.async = schedule.async();
  o.token_budget = schedule.token_budget();
  o.num_data_streams = schedule.num_data_streams();
  o.tokens_per_step = trainer.tokens_per_step();
  o.round_timeout_s = config.outer.round_timeout_s;
  o.retry.timeout_s = config.outer.reconnect_timeout_s;
  o.sync.codec = *compression::ParseCodec(config.outer.codec);  // validated with the config
  o.sync.error_feedback = config.outer.error_feedback;
  o.sync.stochastic_rounding = config.outer.stochastic_rounding;
  o.sync.seed = compression::math::Mix64(config.train.seed) ^ joined.data_stream();
  return o;
}

// Checkpoints: the training thread copies the island's state to CPU memory (the only stall) and a
// background task writes it (temp file, fsync, rename) while training goes on.
class CheckpointHook {
 public:
  CheckpointHook(const Config& config, const IslandOptions& options, inner::Trainer& trainer,
                 Progress& progress, std::string label)
      : config_(config),
        options_(options),
        trainer_(trainer),
        progress_(progress),
        label_(std::move(label)) {}
  ~CheckpointHook() { Wait(); }

  absl::Status Save(bool background, double wall_s) {
    Wait();
    const auto t0 = Clock::now();
    inner::TrainerState state = trainer_.ExportState();
    stall_max_s_ = std::max(stall_max_s_, Since(t0));
    ++saved_;
    auto write = [path = CheckpointPath(options_.run_dir, state.step), state = std::move(state),
                  meta = CheckpointMeta{wall_s, ToToml(config_)}, dir = options_.run_dir,
                  keep = config_.run.checkpoint_keep] {
      auto s = WriteCheckpointShard(path, 0, 1, state, meta);
      if (s.ok()) PruneCheckpoints(dir, keep);
      return s;
    };
    if (!background) return write();
    writing_ = std::async(std::launch::async, std::move(write));
    return absl::OkStatus();
  }
  uint64_t saved() const { return saved_; }
  double stall_max_s() const { return stall_max_s_; }

 private:
  void Wait() {
    if (!writing_.valid()) return;
    if (auto s = writing_.get(); !s.ok()) {
      progress_.Message(absl::StrCat(label_, "warning: checkpoint not written: ", s.message()));
    }
  }
  const Config& config_;
  const IslandOptions& options_;
  inner::Trainer& trainer_;
  Progress& progress_;
  const std::string label_;
  std::future<absl::Status> writing_;
  uint64_t saved_ = 0;
  double stall_max_s_ = 0;
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

// The metrics record and the progress line of a merged round.
void ReportRound(const outer::LandedRound& r, bool async, int64_t tokens, double wall_s,
                 MetricsLog& metrics, Progress& progress, const std::string& label) {
  const auto& o = r.outcome;
  metrics.Write({{"round", o.round},
                 {"fragment", r.fragment},
                 {"step", r.step},
                 {"pushed_at", r.pushed_at},
                 {"tokens", tokens},
                 {"wall_s", wall_s},
                 {"idle_s", r.idle_s},
                 {"push_s", o.push_s},
                 {"wait_s", o.wait_s},
                 {"bytes_sent", o.bytes_sent},
                 {"bytes_received", o.bytes_received},
                 {"contributors", o.contributors},
                 {"version", o.version},
                 {"staleness", o.staleness},
                 {"sync_every", r.sync_every},
                 {"global_hash", absl::StrFormat("%016x", r.global_hash)},
                 {"resynced", o.resynced}});
  std::string line =
      async ? absl::StrFormat(
                  "%sfragment %d now at version %d, merged at step %d (pushed at %d): staleness "
                  "%d, idle %.2fs, sent %d KiB, next H %d",
                  label, r.fragment, o.version, r.step, r.pushed_at, o.staleness, r.idle_s,
                  o.bytes_sent / 1024, r.sync_every)
            : absl::StrFormat(
                  "%sfragment %d round %d merged at step %d (pushed at %d): idle %.2fs, sent %d "
                  "KiB, %d contributors",
                  label, r.fragment, o.round + 1, r.step, r.pushed_at, r.idle_s,
                  o.bytes_sent / 1024, o.contributors);
  if (o.resynced) line += " (resynced: " + o.resync_reason + ")";
  progress.Message(line);
}

void WriteSummary(const IslandOptions& options, const IslandSummary& summary, bool async) {
  nlohmann::json s = {{"island_id", summary.island_id},
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
    s["run_tokens"] = summary.run_tokens;
  }
  WriteFileAtomic((fs::path(options.run_dir) / "summary.json").string(), s.dump(2) + "\n")
      .IgnoreError();
}

}  // namespace

absl::StatusOr<IslandSummary> RunIsland(const Config& config, outer::Transport& transport,
                                        const IslandOptions& options) {
  // Everything that can be checked locally is checked before joining.
  if (auto s = outer::ValidateName(options.name, "island name (--name)"); !s.ok()) return s;
  auto data = inner::LoadDataset(config.data, config.model.context, config.model.vocab);
  if (!data.ok()) return data.status();
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  auto resumed = LoadResumeState(options);
  if (!resumed.ok()) return resumed.status();

  // A coordinator that is restarting, or a run whose data streams are all held (by an island
  // whose lease has not expired yet), is retried with backoff and jitter.
  outer::SessionOptions so;
  so.run_id = config.outer.run_id;
  so.name = options.name;
  so.config_hash = ModelConfigHash(config.model);
  so.heartbeat_s = config.outer.heartbeat_s;
  so.retry.timeout_s = config.outer.reconnect_timeout_s;
  auto session = outer::IslandSession::Join(transport, so);
  if (!session.ok()) return session.status();
  const pb::JoinResponse joined = (*session)->joined();
  if (auto s = CheckRunMatches(config, joined, options); !s.ok()) return s;
  const bool async = joined.schedule().async();
  inner::TrainConfig train = config.train;
  train.steps = int64_t(joined.schedule().total_inner_steps());
  auto trainer = MakeTrainer(config, train, joined, *data, *resumed);
  if (!trainer.ok()) return trainer.status();
  auto fragments =
      ResolveFragments(joined, LayoutOf(inner::NamedParameters(*(*trainer)->model())));
  if (!fragments.ok()) return fragments.status();
  TrainerModel model(**trainer, *std::move(fragments));
  outer::OuterStepHook outer(transport, **session, model, model.FragmentSizes(),
                             OuterOptions(config, joined, **trainer));
  const auto fetch_start = Clock::now();
  if (auto s = outer.FetchGlobal(); !s.ok()) return s;
  const double fetch_s = Since(fetch_start);
  if (async && joined.round() == 0) {
    // Async islands start together: otherwise the first island up could spend the run's whole
    // token budget before the others have started.
    if (auto s = (*session)->WaitForPeers(); !s.ok()) return s;
  }
  (*session)->StartHeartbeats();

  std::error_code ec;
  fs::create_directories(fs::path(options.run_dir) / "checkpoints", ec);
  WriteFileAtomic((fs::path(options.run_dir) / "config.toml").string(), ToToml(config))
      .IgnoreError();
  auto metrics = MetricsLog::Open((fs::path(options.run_dir) / "metrics.jsonl").string(),
                                  *resumed ? (*resumed)->state.step : 0);
  if (!metrics.ok()) return metrics.status();
  const std::string island_id = (*session)->island_id();
  const std::string label = absl::StrCat("[", island_id, "] ");
  Progress progress(options.progress, options.tty, train.steps, config.run.log_every, label);
  if (*resumed) {
    progress.Message(absl::StrFormat("%sresumed from its checkpoint of step %d (AdamW moments, "
                                     "data cursor, RNG); global parameters from the service",
                                     label, (*resumed)->state.step));
  }
  const auto& schedule = joined.schedule();
  progress.Message(absl::StrFormat(
      "%sjoined %s run '%s' at %s %d: data stream %d of %d, H = %d, %d fragment(s), tau = %d, "
      "alpha = %.2f, %s, %s, %.2fM parameters (state: %.1f MiB in %.2fs)%s",
      label, async ? "async" : "sync", config.outer.run_id, async ? "version" : "round",
      outer.round(), joined.data_stream(), schedule.num_data_streams(), schedule.sync_every(),
      schedule.num_fragments(), config.outer.fragment_sync_delay, config.outer.alpha(),
      config.outer.codec,
      async ? absl::StrCat("until the run has trained ", schedule.token_budget(), " tokens")
            : absl::StrCat(train.steps, " inner steps"),
      double(inner::ParameterCount(config.model)) / 1e6, double(outer.fetched_bytes()) / (1 << 20),
      fetch_s, options.throttle > 1 ? absl::StrFormat(", throttled %.1fx", options.throttle) : ""));

  const auto start = Clock::now();
  StepReporter reporter(**metrics, progress);
  LossWatch watch(reporter);
  inner::LossSpikeGuard guard(config.outer.spike_window, config.outer.spike_factor);
  CheckpointHook checkpoints(config, options, **trainer, progress, label);
  IslandSummary summary;
  summary.island_id = island_id;
  outer.set_observer([&](const outer::LandedRound& r) {
    ReportRound(r, async, (*trainer)->tokens(), Since(start), **metrics, progress, label);
  });
  outer.on_message = [&](const std::string& line) { progress.Message(label + line); };
  auto fail = [&](absl::Status s) {
    (*session)->Leave();
    return s;
  };
  auto evaluate = [&](int64_t t) -> absl::Status {
    auto eval = (*trainer)->Evaluate();
    if (!eval.ok()) return eval.status();
    summary.last_eval = *eval;
    nlohmann::json record = {{"step", t}, {"tokens", (*trainer)->tokens()},
                             {"wall_s", Since(start)}, {"val_loss", eval->loss},
                             {eval->per_byte ? "val_bpb" : "val_bits_per_token", eval->bits}};
    if (async) record["run_tokens"] = outer.stats().run_tokens;
    (*metrics)->Write(record);
    progress.Message(absl::StrFormat("%sstep %d | val_loss %.4f", label, t, eval->loss));
    return absl::OkStatus();
  };

  // The inner loop: one step, the spike guard, the outer step, evaluation and checkpoints.
  while ((*trainer)->step() < outer.max_steps()) {
    const auto t0 = Clock::now();
    if (auto s = inner::RunLoop(**trainer, (*trainer)->step() + 1, watch, /*evaluate=*/false);
        !s.ok()) {
      return fail(s);
    }
    if (auto spike = guard.Check(watch.loss)) {
      // The local parameters since the last sync are not to be trusted: drop them (and, for a
      // non-finite loss, the AdamW moments they poisoned) and go on from the global parameters.
      // The next push carries only the steps after this one.
      outer.ReloadGlobal();
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
    (*session)->set_step((*trainer)->step());
    const double steps_per_s = double((*trainer)->step()) / std::max(1e-9, summary.compute_s);
    if (auto s = outer.AfterStep(steps_per_s); !s.ok()) return fail(s);
    const int64_t t = (*trainer)->step();
    const bool last = outer.done();
    // Async islands evaluate the run's final parameters once every island has finished (below).
    const int64_t every = train.eval_every;
    if ((every > 0 && t % every == 0 && !last) || (last && !async)) {
      if (auto s = evaluate(t); !s.ok()) return fail(s);
    }
    const int64_t ckpt_every = config.run.checkpoint_every;
    if (ckpt_every > 0 && t % ckpt_every == 0 && !last) {
      if (auto s = checkpoints.Save(/*background=*/true, Since(start)); !s.ok()) return fail(s);
    }
    if ((options.stop != nullptr && options.stop->load()) || last) break;
  }
  const bool stopped = options.stop != nullptr && options.stop->load();
  if (auto s = outer.Finish(stopped); !s.ok()) return fail(s);
  if (async && !stopped) {
    if (auto s = evaluate((*trainer)->step()); !s.ok()) return fail(s);
  }
  // The last checkpoint is written before the island says it is done.
  if (auto s = checkpoints.Save(/*background=*/false, Since(start)); !s.ok()) {
    progress.Message(absl::StrCat(label, "warning: final checkpoint not written: ", s.message()));
  }
  progress.Finish();
  (*session)->Leave();
  const auto& stats = outer.stats();
  summary.step = (*trainer)->step();
  summary.tokens = (*trainer)->tokens();
  summary.wall_s = Since(start);
  summary.rounds = stats.rounds;
  summary.resyncs = stats.resyncs;
  summary.rejoins = stats.rejoins;
  summary.sync_s = stats.idle_s;
  summary.bytes_sent = stats.bytes_sent;
  summary.bytes_received = stats.bytes_received;
  summary.peak_bytes_in_flight = stats.peak_bytes_in_flight;
  summary.staleness = stats.staleness;
  summary.run_tokens = stats.run_tokens;
  summary.checkpoints = checkpoints.saved();
  summary.checkpoint_stall_max_s = checkpoints.stall_max_s();
  summary.global_hash = outer.global_hash();
  WriteSummary(options, summary, async);
  return summary;
}

}  // namespace atl
