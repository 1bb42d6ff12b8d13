#include "src/island/island_loop.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "compression/codec_math.h"
#include "compression/status_macros.h"
#include "inner/loss_guard.h"
#include "inner/parallel/fsdp.h"
#include "inner/parallel/mesh.h"
#include "outer/island_session.h"
#include "outer/names.h"
#include "outer/outer_step.h"
#include "src/store/checkpoint.h"
#include "src/store/flat_params.h"
#include "src/net/http_server.h"
#include "src/observe/metrics.h"
#include "src/observe/monitoring.h"
#include "src/island/shard_model.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The ranks of an island over its mesh's world group.
class MeshRanks : public outer::IslandRanks {
 public:
  explicit MeshRanks(inner::parallel::Communicator& world) : world_(world) {}
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  absl::StatusOr<bool> Any(bool flag) override {
    auto t = torch::full({1}, flag ? 1.0f : 0.0f);
    ATL_RETURN_IF_ERROR(world_.AllReduceMax(t));
    return t.item<float>() > 0;
  }
  absl::StatusOr<std::string> FromFirst(const std::string& bytes) override {
    return world_.BroadcastBytes(bytes, 0);
  }
  absl::StatusOr<std::string> FromFirstWhere(bool eligible, const std::string& bytes) override {
    // The lowest eligible rank r as the largest size - r (0: none).
    auto first = torch::full({1}, eligible ? float(size() - rank()) : 0.0f);
    ATL_RETURN_IF_ERROR(world_.AllReduceMax(first));
    const int root = first.item<float>() > 0 ? size() - int(first.item<float>()) : 0;
    return world_.BroadcastBytes(bytes, root);
  }

 private:
  inner::parallel::Communicator& world_;
};

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
        "this island is configured for outer.mode = \"", outer::ConfigValueText(config.outer.mode),
        "\" but the run is ",
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
    // An island restarted before its first checkpoint starts afresh from the service's state.
    if (absl::IsNotFound(latest.status())) return std::optional<Checkpoint>();
    if (!latest.ok()) return latest.status();
    ATL_ASSIGN_OR_RETURN(auto ckpt, ReadCheckpoint(*latest));
    return std::optional<Checkpoint>(std::move(ckpt));
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
    std::shared_ptr<const inner::Dataset> data, const std::optional<Checkpoint>& resumed,
    inner::parallel::DeviceMesh* mesh) {
  inner::TrainerConfig trainer_config = config.trainer();
  trainer_config.train = train;
  ATL_ASSIGN_OR_RETURN(auto trainer,
                       inner::Trainer::Create(trainer_config, std::move(data),
                                              int(joined.data_stream()),
                                              int(joined.schedule().num_data_streams()), mesh));
  if (resumed) {
    ATL_RETURN_IF_ERROR(trainer->ImportState(resumed->state));
  }
  if (!joined.schedule().async() && joined.round() > 0) {
    // A late joiner takes part from the run's current round: its step count (and so its
    // learning-rate schedule and its last step) line up with the other islands'.
    const outer::SyncSchedule schedule(int(joined.schedule().sync_every()),
                                       int(joined.schedule().num_fragments()),
                                       outer::PhasesOf(joined.schedule()));
    trainer->SetStep(schedule.RoundStart(0, joined.round()));
    if (!resumed && config.outer.join_warmup_steps > 0) {
      trainer->RampLearningRate(config.outer.join_warmup_steps);
    }
  }
  return trainer;
}

// The service's schedule, this island's own choices from its [outer] section, its tokens per step.
outer::OuterStepOptions OuterOptions(const Config& config, const pb::JoinResponse& joined,
                                     const inner::Trainer& trainer) {
  outer::OuterStepOptions o;
  o.schedule = outer::ScheduleOf(joined.schedule());
  o.island = outer::IslandChoicesOf(
      config.outer, compression::math::Mix64(config.train.seed) ^ joined.data_stream());
  o.tokens_per_step = trainer.tokens_per_step();
  return o;
}

// Checkpoints: the training thread copies the island's state to CPU memory (the only stall) and a
// background task writes it (temp file, fsync, rename) while training goes on.
class CheckpointHook {
 public:
  CheckpointHook(const Config& config, const IslandOptions& options, inner::Trainer& trainer,
                 Progress& progress, std::string label, IslandMonitor& monitor)
      : config_(config),
        options_(options),
        trainer_(trainer),
        progress_(progress),
        label_(std::move(label)),
        monitor_(monitor) {}
  // Each rank writes its part; the checkpoint counts once every rank's part is there.
  ~CheckpointHook() { Wait(); }

  absl::Status Save(bool background, double wall_s) {
    Wait();
    const auto t0 = Clock::now();
    inner::TrainerState state = trainer_.ExportState();
    stall_max_s_ = std::max(stall_max_s_, Since(t0));
    monitor_.OnCheckpointStall(Since(t0));
    ++saved_;
    auto write = [path = CheckpointPath(options_.run_dir, state.step), state = std::move(state),
                  meta = CheckpointMeta{wall_s, ToToml(config_)}, dir = options_.run_dir,
                  keep = config_.train.checkpoint_keep, rank = options_.rank,
                  monitor = &monitor_] {
      const auto start = Clock::now();
      auto s = WriteCheckpointShard(path, rank.rank, rank.world_size, state, meta);
      if (s.ok()) monitor->OnCheckpointWritten(Since(start));
      if (s.ok() && rank.rank == 0) PruneCheckpoints(dir, keep);
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
  IslandMonitor& monitor_;
  std::future<absl::Status> writing_;
  uint64_t saved_ = 0;
  double stall_max_s_ = 0;
};

nlohmann::json RangeHashesJson(const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& ranges) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [b, e, h] : ranges) j[absl::StrCat(b, "-", e)] = absl::StrFormat("%016x", h);
  return j;
}

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
                 {"quantization_error", o.quantization_error},
                 {"contributors", o.contributors},
                 {"version", o.version},
                 {"staleness", o.staleness},
                 {"sync_every", r.sync_every},
                 {"tau", r.tau},
                 {"global_hash", absl::StrFormat("%016x", r.global_hash)},
                 {"range_hashes", RangeHashesJson(r.range_hashes)},
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

void WriteSummary(const IslandOptions& options, const IslandSummary& summary, bool async,
                  int ranks) {
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
                      {"tau", summary.tau},
                      {"link_mbps", summary.link_bps / 1e6},
                      {"utilization", summary.compute_s / std::max(1e-9, summary.wall_s)},
                      {"throttle", options.throttle},
                      {"ranks", ranks},
                      // With several ranks: of rank 0's part (each rank logs its ranges' hashes).
                      {"global_hash", absl::StrFormat("%016x", summary.global_hash)},
                      {"global_copy", summary.global_copy}};
  if (summary.last_eval) s["val_loss"] = summary.last_eval->loss;
  if (async) {
    s["staleness"] = summary.staleness;
    s["run_tokens"] = summary.run_tokens;
  }
  WriteFileAtomic((fs::path(options.run_dir) / "summary.json").string(), s.dump(2) + "\n")
      .IgnoreError();
}

// One island (this rank of it) from join to summary: Setup, Train, Finish, each in its steps.
class IslandRun {
 public:
  IslandRun(const Config& config, outer::Transport& transport, const IslandOptions& options)
      : config_(config), transport_(transport), options_(options) {}

  absl::StatusOr<IslandSummary> Run() {
    ATL_RETURN_IF_ERROR(Setup());
    if (auto s = Train(); !s.ok()) return Fail(s);
    return Finish();
  }

 private:
  bool lead() const { return options_.rank.rank == 0; }
  absl::Status Setup();
  absl::Status JoinAndBuild();
  absl::Status OpenOutputs();
  absl::Status Train();
  bool StatsDueAfter(int64_t t) const;
  absl::Status ReportSteps(inner::LoopObserver& reporter, inner::LossSpikeGuard& guard);
  absl::StatusOr<IslandSummary> Finish();
  absl::Status Evaluate(int64_t t);
  // What the heartbeats tell the service of this island's training (clamped to what it accepts).
  pb::IslandTelemetry Telemetry(double loss) const;
  absl::Status Fail(absl::Status s) {
    session_->Leave();
    return s;
  }

  const Config& config_;
  outer::Transport& transport_;
  const IslandOptions& options_;
  std::shared_ptr<const inner::Dataset> data_;
  std::optional<Checkpoint> resumed_;
  std::unique_ptr<inner::parallel::DeviceMesh> mesh_;
  std::unique_ptr<outer::IslandRanks> ranks_;
  std::unique_ptr<outer::IslandSession> session_;
  pb::JoinResponse joined_;
  bool async_ = false;
  inner::TrainConfig train_;
  std::unique_ptr<inner::Trainer> trainer_;
  std::optional<ShardModel> model_;
  std::unique_ptr<outer::OuterStepHook> outer_;
  std::unique_ptr<MetricsLog> metrics_;
  FILE* quiet_ = nullptr;  // progress of ranks other than 0
  std::unique_ptr<Progress> progress_;
  std::string label_;
  std::unique_ptr<IslandMonitor> monitor_;
  std::unique_ptr<HttpServer> metrics_server_;
  std::unique_ptr<CheckpointHook> checkpoints_;
  Clock::time_point start_;
  double fetch_s_ = 0;
  bool stopped_ = false;
  IslandSummary summary_;
};

absl::Status IslandRun::Setup() {
  // Everything that can be checked locally is checked before joining.
  ATL_RETURN_IF_ERROR(outer::ValidateName(options_.name, "island name (--name)"));
  ATL_ASSIGN_OR_RETURN(
      auto data, inner::LoadDataset(config_.data, config_.model.context, config_.model.vocab));
  data_ = data;
  if (options_.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  ATL_ASSIGN_OR_RETURN(auto resumed, LoadResumeState(options_));
  resumed_ = std::move(resumed);
  const auto timeout = std::chrono::milliseconds(int64_t(options_.collective_timeout_s * 1000));
  if (options_.rank.world_size > 1) {
    ATL_ASSIGN_OR_RETURN(
        auto shape, inner::parallel::ResolveMesh(config_.parallelism, options_.rank.world_size));
    // Rank 0 may wait on the service for as long as a join retries (plus the call's own
    // deadline): the other ranks wait that long for its decisions.
    const auto control = std::chrono::milliseconds(int64_t(
        1000 * (config_.outer.reconnect_timeout_s + 2 * config_.outer.rpc_timeout_s +
                config_.outer.round_timeout_s)));
    // NCCL inside an island on GPUs, Gloo on CPUs.
    ATL_ASSIGN_OR_RETURN(auto device,
                         inner::ResolveDevice(config_.train.device, options_.rank.local_rank));
    ATL_ASSIGN_OR_RETURN(auto mesh, inner::parallel::DeviceMesh::Create(
                                        shape, options_.rank, device != "cpu", timeout, control));
    mesh_ = std::move(mesh);
  } else {
    mesh_ = inner::parallel::DeviceMesh::Single();
  }
  ranks_ = std::make_unique<MeshRanks>(mesh_->control());
  std::error_code ec;
  fs::create_directories(options_.run_dir, ec);
  ATL_RETURN_IF_ERROR(JoinAndBuild());
  return OpenOutputs();
}

absl::Status IslandRun::JoinAndBuild() {
  // A coordinator that is restarting, or a run whose data streams are all held (by an island
  // whose lease has not expired yet), is retried with backoff and jitter.
  const outer::SessionOptions so = outer::SessionOptionsOf(
      config_.outer, options_.name, ModelConfigHash(config_.model),
      (fs::path(options_.run_dir) / "session.credential").string());
  ATL_ASSIGN_OR_RETURN(auto session, outer::IslandSession::JoinAsIsland(transport_, so, *ranks_));
  session_ = std::move(session);
  joined_ = session_->joined();
  if (auto s = CheckRunMatches(config_, joined_, options_); !s.ok()) return Fail(s);
  async_ = joined_.schedule().async();
  train_ = config_.train;
  train_.steps = int64_t(joined_.schedule().total_inner_steps());
  auto trainer = MakeTrainer(config_, train_, joined_, data_, resumed_, mesh_.get());
  if (!trainer.ok()) return Fail(trainer.status());
  trainer_ = *std::move(trainer);
  auto model = MapFragments(joined_, *trainer_);
  if (!model.ok()) return Fail(model.status());
  model_.emplace(*std::move(model));
  if (auto s = model_->PlaceGlobalCopy(config_.outer.global_copy, config_.outer.codec); !s.ok()) return Fail(s);
  for (uint32_t f = 0; f < uint32_t(joined_.fragments_size()); ++f) {
    if (model_->device_copy(f) != nullptr) summary_.global_copy = "device";
  }
  outer_ = std::make_unique<outer::OuterStepHook>(transport_, *session_, *ranks_, *model_,
                                                  model_->Shares(),
                                                  OuterOptions(config_, joined_, *trainer_));
  const auto fetch_start = Clock::now();
  if (auto s = outer_->FetchGlobal(); !s.ok()) return Fail(s);
  if (auto s = model_->SyncReplicas(); !s.ok()) return Fail(s);
  fetch_s_ = Since(fetch_start);
  if (async_ && joined_.round() == 0 && lead()) {
    // Async islands start together: otherwise the first island up could spend the run's whole
    // token budget before the others have started.
    if (auto s = session_->WaitForPeers(); !s.ok()) return Fail(s);
  }
  if (auto ready = ranks_->Any(false); !ready.ok()) return Fail(ready.status());
  session_->StartHeartbeats();
  return absl::OkStatus();
}

absl::Status IslandRun::OpenOutputs() {
  std::error_code ec;
  fs::create_directories(fs::path(options_.run_dir) / "checkpoints", ec);
  const int64_t keep_through = resumed_ ? resumed_->state.step : 0;
  // Rank 0 keeps the island's log; the others log their rounds (and the ranges they hold).
  const std::string log = lead() ? "metrics.jsonl"
                                 : absl::StrCat("metrics-rank-", options_.rank.rank, ".jsonl");
  auto metrics = MetricsLog::Open((fs::path(options_.run_dir) / log).string(), keep_through);
  if (!metrics.ok()) return Fail(metrics.status());
  metrics_ = *std::move(metrics);
  const std::string island_id = session_->island_id();
  label_ = options_.rank.world_size > 1 && !lead()
               ? absl::StrCat("[", island_id, ".", options_.rank.rank, "] ")
               : absl::StrCat("[", island_id, "] ");
  FILE* out = options_.progress;
  if (!lead()) out = quiet_ = std::fopen("/dev/null", "w");
  progress_ = std::make_unique<Progress>(out, options_.tty, train_.steps, config_.train.log_every,
                                         label_);
  monitor_ = std::make_unique<IslandMonitor>(island_id, options_.rank.rank, async_);
  if (!options_.metrics_listen.empty()) {
    // Each rank serves its own metrics, rank r on the given port + r.
    auto address = OffsetAddress(options_.metrics_listen, options_.rank.rank);
    if (!address.ok()) return Fail(address.status());
    auto server = HttpServer::Start(*address, {{"/metrics", [m = monitor_.get()] {
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", m->PrometheusText()};
    }}});
    if (!server.ok()) return Fail(server.status());
    metrics_server_ = *std::move(server);
    // Every rank says where (the others' progress is quiet).
    std::fprintf(options_.progress, "%smetrics on http://%s/metrics\n", label_.c_str(),
                 metrics_server_->address().c_str());
    std::fflush(options_.progress);
  }
  checkpoints_ = std::make_unique<CheckpointHook>(config_, options_, *trainer_, *progress_, label_,
                                                  *monitor_);
  if (lead()) {
    WriteFileAtomic((fs::path(options_.run_dir) / "config.toml").string(), ToToml(config_))
        .IgnoreError();
  }
  if (resumed_) {
    progress_->Message(absl::StrFormat(
        "%sresumed from its checkpoint of step %d (AdamW moments, data cursor, RNG); global "
        "parameters from the service",
        label_, resumed_->state.step));
  }
  const auto& schedule = joined_.schedule();
  const auto& shape = mesh_->shape();
  progress_->Message(absl::StrFormat(
      "%sjoined %s run '%s' at %s %d: data stream %d of %d, %s, %s, %.2fM parameters (state: "
      "%.1f MiB in %.2fs)%s%s",
      label_, async_ ? "async" : "sync", config_.outer.run_id, async_ ? "version" : "round",
      outer_->round(), joined_.data_stream(), schedule.num_data_streams(), outer_->Describe(),
      async_ ? absl::StrCat("until the run has trained ", schedule.token_budget(), " tokens")
             : absl::StrCat(train_.steps, " inner steps"),
      double(inner::ParameterCount(config_.model)) / 1e6,
      double(outer_->fetched_bytes()) / (1 << 20), fetch_s_,
      shape.size() > 1
          ? absl::StrFormat(", %d ranks (pp %d x dp_replicate %d x dp_shard %d x tp %d)",
                            shape.size(), shape.pp, shape.dp_replicate, shape.dp_shard, shape.tp)
                       : "",
      options_.throttle > 1 ? absl::StrFormat(", throttled %.1fx", options_.throttle) : ""));
  start_ = Clock::now();
  summary_.island_id = island_id;
  outer_->set_observer([this](const outer::LandedRound& r) {
    monitor_->OnRound(r.fragment, r.outcome, r.idle_s);
    ReportRound(r, async_, trainer_->tokens(), Since(start_), *metrics_, *progress_, label_);
  });
  outer_->on_message = [this](const std::string& line) { progress_->Message(label_ + line); };
  return absl::OkStatus();
}

pb::IslandTelemetry IslandRun::Telemetry(double loss) const {
  auto bounded = [](double v, double max) { return std::isfinite(v) ? std::clamp(v, 0.0, max) : 0.0; };
  const auto& stats = outer_->stats();
  pb::IslandTelemetry t;
  t.set_loss(bounded(loss, 1e4));
  t.set_val_loss(summary_.last_eval ? bounded(summary_.last_eval->loss, 1e4) : 0.0);
  t.set_tokens_per_s(bounded(monitor_->tokens_per_s(), 1e12));
  t.set_utilization(bounded(summary_.compute_s / std::max(1e-9, Since(start_)), 1));
  t.set_tokens(uint64_t(trainer_->tokens()));
  t.set_bytes_sent(stats.bytes_sent);
  t.set_bytes_received(stats.bytes_received);
  return t;
}

absl::Status IslandRun::Evaluate(int64_t t) {
  ATL_ASSIGN_OR_RETURN(auto eval, trainer_->Evaluate());
  summary_.last_eval = eval;
  monitor_->OnEval(eval.loss);
  nlohmann::json record = {{"step", t},
                           {"tokens", trainer_->tokens()},
                           {"wall_s", Since(start_)},
                           {"val_loss", eval.loss},
                           {eval.per_byte ? "val_bpb" : "val_bits_per_token", eval.bits}};
  if (async_) record["run_tokens"] = outer_->stats().run_tokens;
  if (lead()) metrics_->Write(record);
  progress_->Message(absl::StrFormat("%sstep %d | val_loss %.4f", label_, t, eval.loss));
  return absl::OkStatus();
}

// Whether the steps' stats must come over from the device after step t: a progress line is due,
// or something that must follow every step judged (a push, an evaluation, a checkpoint, the end).
bool IslandRun::StatsDueAfter(int64_t t) const {
  const int64_t eval_every = train_.eval_every, ckpt_every = config_.train.checkpoint_every;
  return t % config_.train.log_every == 0 || outer_->PushesAfter(t) ||
         (eval_every > 0 && t % eval_every == 0) || (ckpt_every > 0 && t % ckpt_every == 0) ||
         t >= outer_->max_steps();
}

// The stats of the steps trained since the last report, in one copy from the device: rank 0
// reports each, the spike guard judges their losses in order, the monitor and the service see
// them. A spike drops the local progress since the last sync, the steps after it included (they
// went on from the spiked parameters; their losses stay unjudged).
absl::Status IslandRun::ReportSteps(inner::LoopObserver& reporter, inner::LossSpikeGuard& guard) {
  const auto t0 = Clock::now();
  ATL_ASSIGN_OR_RETURN(auto steps, trainer_->TakeStats());
  summary_.compute_s += Since(t0);  // the wait for the device is the steps' compute
  std::optional<std::string> spike;
  int64_t spike_step = 0;
  bool finite = true;
  for (const auto& step : steps) {
    ATL_RETURN_IF_ERROR(reporter.OnStep(step, nullptr));
    // The losses are the island's (reduced over its ranks): every rank takes the same decision.
    if (!spike && (spike = guard.Check(step.loss))) spike_step = step.step;
    finite = finite && std::isfinite(step.loss);
  }
  if (steps.empty()) return absl::OkStatus();
  const inner::StepStats& last = steps.back();
  monitor_->OnSteps(int64_t(steps.size()), last.loss, last.tokens, summary_.compute_s,
                    Since(start_));
  if (lead()) session_->set_telemetry(Telemetry(last.loss));
  if (!spike) return absl::OkStatus();
  // The local parameters since the last sync are not to be trusted: drop them (and, after a
  // non-finite loss, the AdamW moments it poisoned) and go on from the global parameters. The
  // next push carries only the steps after this report.
  ATL_RETURN_IF_ERROR(outer_->ReloadGlobal());
  ATL_RETURN_IF_ERROR(model_->SyncReplicas());
  if (!finite) trainer_->optimizer().Reset();
  summary_.spikes += 1;
  progress_->Message(absl::StrFormat("%sstep %d: %s; reloaded the global parameters", label_,
                                     spike_step, *spike));
  return absl::OkStatus();
}

// The inner loop: steps queued on the device, their stats reported and judged where due, the
// outer step, evaluation and checkpoints.
absl::Status IslandRun::Train() {
  // Rank 0 reports the island's steps (their losses are the island's, reduced over its ranks).
  struct Quiet : inner::LoopObserver {
    absl::Status OnStep(const inner::StepStats&, const inner::EvalStats*) override {
      return absl::OkStatus();
    }
  } quiet;
  StepReporter reporter(*metrics_, *progress_);
  inner::LoopObserver& report = lead() ? static_cast<inner::LoopObserver&>(reporter) : quiet;
  inner::LossSpikeGuard guard(config_.outer.spike_window, config_.outer.spike_factor);
  while (trainer_->step() < outer_->max_steps()) {
    const auto t0 = Clock::now();
    ATL_RETURN_IF_ERROR(trainer_->QueueStep());
    if (options_.throttle > 1) {
      // A slower island, honestly: the step takes `throttle` times as long in wall-clock time.
      std::this_thread::sleep_for(
          std::chrono::duration<double>(Since(t0) * (options_.throttle - 1)));
    }
    summary_.compute_s += Since(t0);
    summary_.steps_trained += 1;
    int64_t t = trainer_->step();
    session_->set_step(t);
    if (StatsDueAfter(t)) {
      ATL_RETURN_IF_ERROR(ReportSteps(report, guard));
    }
    const double steps_per_s = double(t) / std::max(1e-9, summary_.compute_s);
    ATL_RETURN_IF_ERROR(outer_->AfterStep(steps_per_s));
    ATL_RETURN_IF_ERROR(model_->SyncReplicas());
    t = trainer_->step();  // a rejoin moves it to the run's
    const bool last = outer_->done();
    // Async islands evaluate the run's final parameters once every island has finished.
    const int64_t every = train_.eval_every;
    if ((every > 0 && t % every == 0 && !last) || (last && !async_)) {
      ATL_RETURN_IF_ERROR(Evaluate(t));
    }
    const int64_t ckpt_every = config_.train.checkpoint_every;
    if (ckpt_every > 0 && t % ckpt_every == 0 && !last) {
      ATL_RETURN_IF_ERROR(checkpoints_->Save(/*background=*/true, Since(start_)));
    }
    // A stop (SIGTERM on any rank) ends the island on every rank at the same step.
    ATL_ASSIGN_OR_RETURN(auto stop, ranks_->Any(options_.stop != nullptr && options_.stop->load()));
    stopped_ = stop;
    if (stopped_ || last) break;
  }
  return ReportSteps(report, guard);  // a stop's steps
}

absl::StatusOr<IslandSummary> IslandRun::Finish() {
  if (auto s = outer_->Finish(stopped_); !s.ok()) return Fail(s);
  if (auto s = model_->SyncReplicas(); !s.ok()) return Fail(s);
  if (async_ && !stopped_) {
    if (auto s = Evaluate(trainer_->step()); !s.ok()) return Fail(s);
  }
  // The last checkpoint is written before the island says it is done.
  if (auto s = checkpoints_->Save(/*background=*/false, Since(start_)); !s.ok()) {
    progress_->Message(absl::StrCat(label_, "warning: final checkpoint not written: ", s.message()));
  }
  progress_->Finish();
  session_->Leave();
  const auto& stats = outer_->stats();
  summary_.step = trainer_->step();
  summary_.tokens = trainer_->tokens();
  summary_.wall_s = Since(start_);
  summary_.rounds = stats.rounds;
  summary_.resyncs = stats.resyncs;
  summary_.rejoins = stats.rejoins;
  summary_.sync_s = stats.idle_s;
  summary_.bytes_sent = stats.bytes_sent;
  summary_.bytes_received = stats.bytes_received;
  summary_.peak_bytes_in_flight = stats.peak_bytes_in_flight;
  summary_.tau = stats.tau;
  summary_.link_bps = stats.link_bps;
  summary_.staleness = stats.staleness;
  summary_.run_tokens = stats.run_tokens;
  summary_.checkpoints = checkpoints_->saved();
  summary_.checkpoint_stall_max_s = checkpoints_->stall_max_s();
  summary_.global_hash = outer_->global_hash();
  if (lead()) WriteSummary(options_, summary_, async_, mesh_->shape().size());
  if (quiet_ != nullptr) std::fclose(quiet_);
  return summary_;
}

}  // namespace

absl::StatusOr<IslandSummary> RunIsland(const Config& config, outer::Transport& transport,
                                        const IslandOptions& options) {
  return IslandRun(config, transport, options).Run();
}

}  // namespace atl
