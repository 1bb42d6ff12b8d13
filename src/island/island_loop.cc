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
#include "compression/status_macros.h"
#include "inner/loop_parts.h"
#include "inner/parallel/fsdp.h"
#include "inner/parallel/mesh.h"
#include "outer/island/island_runtime.h"
#include "outer/base/names.h"
#include "outer/island/outer_step.h"
#include "src/store/checkpoint.h"
#include "src/store/flat_params.h"
#include "src/net/http_server.h"
#include "src/observe/metrics.h"
#include "src/observe/monitoring.h"
#include "src/island/island_report.h"
#include "src/island/shard_model.h"
#include "src/text/token_shards.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Clock = IslandClock;

// What the join line says of the state an island started from besides its download: fragments
// that were its own seeded parameters, the run's averaged optimizer moments it took, and whether
// it keeps its own moments in a run that averages them (its ranks would not own disjoint ranges).
std::string StateNotes(const outer::OuterStepStats& stats, int fragments, bool keeps_moments) {
  std::string notes;
  if (stats.seeded_fragments > 0) {
    notes += absl::StrFormat("; %d of %d fragment(s) its own seeded parameters, hash-checked",
                             stats.seeded_fragments, fragments);
  }
  if (stats.joined_with_moments > 0) {
    notes += absl::StrFormat("; optimizer moments: the run's average (%d fragment(s))",
                             stats.joined_with_moments);
  }
  if (keeps_moments) {
    notes += "; optimizer moments: its own, not averaged (tensor parallelism or replicated shards)";
  }
  return notes;
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
  ATL_RETURN_IF_ERROR(outer::CheckRunMode(config.outer, joined.schedule()));
  const uint64_t tokens_per_rank = config.tokens_per_rank_step();
  if (joined.schedule().tokens_per_step() > 0 &&
      tokens_per_rank > joined.schedule().tokens_per_step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this island trains ", tokens_per_rank, " tokens per inner step on each rank (train.batch_size x "
        "train.grad_accum x model.context); the run weighs contributions by at most ",
        joined.schedule().tokens_per_step(), ": use the coordinator's [train] batch"));
  }
  if (!(options.throttle >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--throttle must be a factor >= 1, got ", options.throttle));
  }
  return absl::OkStatus();
}

// An island checkpoints every outer.checkpoint_rounds rounds and every train.checkpoint_every
// steps: every the smaller of the two (0: never before the end).
int64_t CheckpointEvery(const Config& config) {
  const int64_t rounds = int64_t(config.outer.checkpoint_rounds) * config.outer.sync_every;
  const int64_t steps = config.train.checkpoint_every;
  if (rounds > 0 && steps > 0) return std::min(rounds, steps);
  return std::max(rounds, steps);
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
  // A late joiner's step is the rounds' it fetches (outer::OuterStepHook::FetchGlobal); a fresh
  // one ramps its learning rate up.
  if (!joined.schedule().async() && joined.round() > 0 && !resumed &&
      config.outer.join_warmup_steps > 0) {
    trainer->RampLearningRate(config.outer.join_warmup_steps);
  }
  return trainer;
}

// One island (this rank of it) from join to summary: Setup, Train, Finish, each in its steps.
// Train is the one training loop (inner/loop.h) with the shared parts (the steps' reports, the
// loss-spike guard, evaluations, checkpoints, the island-wide stop: inner/loop_parts.h) around
// the island's own: its pacing and monitor, and the outer step.
class IslandRun : private inner::LoopPart {
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
  absl::Status RehearseCopier();
  absl::Status JoinAndBuild();
  absl::Status OpenOutputs();
  absl::Status Train();
  absl::StatusOr<IslandSummary> Finish();
  absl::Status WrapUp();  // evaluations and the last checkpoint, before leaving
  // The island's part of the loop: its pacing, its monitor and telemetry, the outer step.
  void BeforeStep() override { step_start_ = Clock::now(); }
  absl::Status Queued(int64_t t) override;
  bool StatsDue(int64_t t) const override { return outer_->PushesAfter(t); }
  absl::Status OnStats(const std::vector<inner::StepStats>& steps) override;
  absl::StatusOr<bool> OuterStep(int64_t t) override;
  // What the shared parts do for it.
  absl::Status Evaluate(int64_t t);
  absl::Status OnSpike(int64_t step, const std::string& why, bool finite);
  // What the heartbeats tell the service of this island's training (clamped to what it accepts).
  pb::IslandTelemetry Telemetry(double loss) const;
  double last_loss_ = 0;  // the training loss of the last stats report
  absl::Status Fail(absl::Status s) {
    if (runtime_) runtime_->Leave();
    return s;
  }

  const Config& config_;
  outer::Transport& transport_;
  const IslandOptions& options_;
  std::shared_ptr<const inner::Dataset> data_;
  std::optional<::atl::Checkpoint> resumed_;
  std::unique_ptr<inner::parallel::DeviceMesh> mesh_;
  std::unique_ptr<outer::IslandRanks> ranks_;
  pb::JoinResponse joined_;
  bool async_ = false;
  inner::TrainConfig train_;
  std::unique_ptr<inner::Trainer> trainer_;
  std::optional<ShardModel> model_;
  // The island's runtime (after the model it drives): its session and outer step.
  std::unique_ptr<outer::IslandRuntime> runtime_;
  outer::IslandSession* session_ = nullptr;
  outer::OuterStepHook* outer_ = nullptr;
  std::unique_ptr<MetricsLog> metrics_;
  FILE* quiet_ = nullptr;  // progress of ranks other than 0
  std::unique_ptr<Progress> progress_;
  RoundLines round_lines_{10.0};  // the warm start's rounds: a line every 10 s (the coordinator says more)
  std::string label_;
  std::unique_ptr<IslandMonitor> monitor_;
  std::unique_ptr<HttpServer> metrics_server_;
  std::unique_ptr<CheckpointHook> checkpoints_;
  Clock::time_point start_;
  Clock::time_point step_start_;
  std::optional<StepReporter> reporter_;  // rank 0's: the island's steps
  double typical_step_s_ = 0;  // --throttle: recent steps' compute time (an average)
  bool stopped_ = false;
  IslandSummary summary_;
};

// The trainer, the wait for its stats counted as the steps' compute.
class TimedSteps : public inner::StepSource {
 public:
  TimedSteps(inner::Trainer& trainer, double& compute_s) : trainer_(trainer), compute_s_(compute_s) {}
  int64_t step() const override { return trainer_.step(); }
  absl::Status QueueStep() override { return trainer_.QueueStep(); }
  absl::StatusOr<std::vector<inner::StepStats>> TakeStats() override {
    const auto t0 = Clock::now();
    auto stats = trainer_.TakeStats();
    compute_s_ += Since(t0);  // the wait for the device is the steps' compute
    return stats;
  }

 private:
  inner::Trainer& trainer_;
  double& compute_s_;
};

// outer.fault = "copy": the island trains the data stream after its own, another island's, with
// that island's seeds, so its pushes equal that island's (what a copier of payloads sends, with no
// data of its own trained).
absl::Status IslandRun::RehearseCopier() {
  if (config_.outer.fault != "copy") return absl::OkStatus();
  const uint32_t streams = joined_.schedule().num_data_streams();
  if (streams < 2) {
    return absl::FailedPreconditionError(
        "outer.fault = \"copy\" needs another island's data stream; this run has one");
  }
  const uint32_t own = joined_.data_stream();
  joined_.set_data_stream((own + 1) % streams);
  if (lead()) {
    std::fprintf(options_.progress,
                 "[%s] rehearsing a copier: it trains data stream %u, another island's, instead "
                 "of its own %u\n",
                 options_.name.c_str(), joined_.data_stream(), own);
  }
  return absl::OkStatus();
}

absl::Status IslandRun::Setup() {
  // Everything that can be checked locally is checked before joining.
  ATL_RETURN_IF_ERROR(outer::ValidateName(options_.name, "island name (--name)"));
  ATL_ASSIGN_OR_RETURN(
      auto data, text::LoadDataset(config_.data, config_.model));
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
  outer::RuntimeOptions ro;
  ro.outer = config_.outer;
  ro.name = options_.name;
  ro.model_hash = ModelConfigHash(config_.model);
  ro.credential_file = (fs::path(options_.run_dir) / "session.credential").string();
  ro.data_parallel = uint32_t(mesh_->shape().dp());
  ro.seed = config_.train.seed;
  if (lead()) {
    ro.say = [this](const std::string& line) {
      std::fprintf(options_.progress, "[%s] %s\n", options_.name.c_str(), line.c_str());
      std::fflush(options_.progress);
    };
  }
  ATL_ASSIGN_OR_RETURN(runtime_, outer::IslandRuntime::Join(transport_, *ranks_, std::move(ro)));
  session_ = &runtime_->session();
  joined_ = runtime_->joined();
  if (auto s = CheckRunMatches(config_, joined_, options_); !s.ok()) return Fail(s);
  if (auto s = RehearseCopier(); !s.ok()) return Fail(s);
  async_ = runtime_->async();
  train_ = config_.train;
  train_.steps = int64_t(joined_.schedule().total_inner_steps());
  auto trainer = MakeTrainer(config_, train_, joined_, data_, resumed_, mesh_.get());
  if (!trainer.ok()) return Fail(trainer.status());
  trainer_ = *std::move(trainer);
  auto model = MapFragments(joined_, *trainer_);
  if (!model.ok()) return Fail(model.status());
  model_.emplace(*std::move(model));
  // Eager updates make their stand-ins from host copies.
  const outer::GlobalCopy where =
      config_.outer.eager_updates ? outer::GlobalCopy::kHost : config_.outer.global_copy;
  if (auto s = model_->PlaceGlobalCopy(where, config_.outer.wire_codec()); !s.ok()) return Fail(s);
  for (uint32_t f = 0; f < uint32_t(joined_.fragments_size()); ++f) {
    if (model_->device_copy(f) != nullptr) summary_.global_copy = "device";
  }
  outer::StartOptions start;
  start.tokens_per_step = trainer_->tokens_per_step();
  if (resumed_) {
    start.resumed = true;
    start.residuals = ResidualsOf(resumed_->state);
  }
  start.after_fetch = [this] { return model_->SyncReplicas(); };
  if (auto s = runtime_->Start(*model_, model_->Shares(), std::move(start)); !s.ok()) {
    return Fail(s);
  }
  outer_ = &runtime_->hook();
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
                                                  *monitor_, [this] {
                                                    return outer_ ? outer_->Residuals()
                                                                  : std::vector<outer::OuterStepHook::Residual>();
                                                  });
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
      "%.1f MiB in %.2fs%s)%s%s",
      label_, async_ ? "async" : "sync", config_.outer.run_id, async_ ? "version" : "round",
      outer_->round(), joined_.data_stream(), schedule.num_data_streams(), outer_->Describe(),
      async_ ? absl::StrCat("until the run has trained ", schedule.token_budget(), " tokens")
             : absl::StrCat(train_.steps, " inner steps"),
      double(inner::ParameterCount(config_.model)) / 1e6,
      double(outer_->fetched_bytes()) / (1 << 20), runtime_->fetch_s(),
      StateNotes(outer_->stats(), joined_.fragments_size(),
                 schedule.moment_sync_every() > 0 && model_->moment_optimizer().empty()),
      shape.size() > 1
          ? absl::StrFormat(", %d ranks (pp %d x dp_replicate %d x dp_shard %d x tp %d)",
                            shape.size(), shape.pp, shape.dp_replicate, shape.dp_shard, shape.tp)
                       : "",
      options_.throttle > 1 ? absl::StrFormat(", throttled %.1fx", options_.throttle) : ""));
  start_ = Clock::now();
  summary_.island_id = island_id;
  outer_->set_observer([this](const outer::LandedRound& r) {
    monitor_->OnRound(r.fragment, r.outcome, r.idle_s);
    const bool quick =
        !async_ && config_.outer.phases.QuickRound(r.outcome.round) && !r.outcome.resynced;
    ReportRound(r, async_, trainer_->tokens(), Since(start_), *metrics_, *progress_, label_,
                round_lines_.Take(quick, Since(start_)));
  });
  outer_->on_message = [this](const std::string& line) { progress_->Message(label_ + line); };
  return absl::OkStatus();
}

pb::IslandTelemetry IslandRun::Telemetry(double loss) const {
  outer::TrainingFigures f;
  f.loss = loss;
  if (summary_.last_eval) {
    f.val_loss = summary_.last_eval->loss;
    f.val_bpb = summary_.last_eval->bits_per_byte;
  }
  f.tokens_per_s = monitor_->tokens_per_s();
  f.utilization = summary_.compute_s / std::max(1e-9, Since(start_));
  f.tokens = uint64_t(trainer_->tokens());
  f.tokens_trained = uint64_t(summary_.steps_trained) * uint64_t(trainer_->tokens_per_step());
  f.stuck_reloads = outer_->stuck_reloads();
  return outer::TelemetryOf(f, outer_->stats());
}

absl::Status IslandRun::Evaluate(int64_t t) {
  ATL_ASSIGN_OR_RETURN(auto eval, trainer_->Evaluate());
  summary_.last_eval = eval;
  monitor_->OnEval(eval.loss);
  // The service's status page and metrics have it with the next heartbeat, not the next stats.
  if (lead()) session_->set_telemetry(Telemetry(last_loss_));
  nlohmann::json record = {{"step", t}, {"tokens", trainer_->tokens()}, {"wall_s", Since(start_)}};
  AddEvalFields(eval, &record);
  if (async_) record["run_tokens"] = outer_->stats().run_tokens;
  if (lead()) metrics_->Write(record);
  progress_->Message(absl::StrFormat("%sstep %d | %s", label_, t, EvalText(eval)));
  return absl::OkStatus();
}

absl::Status IslandRun::Queued(int64_t t) {
  if (options_.throttle > 1) {
    // A slower island, honestly: the step takes `throttle` times as long in wall-clock time. A
    // step far longer than the recent ones was paused (SIGSTOP) or stalled, not computed: it is
    // throttled as a typical one.
    double step = Since(step_start_);
    if (typical_step_s_ > 0 && step > 10 * typical_step_s_) step = typical_step_s_;
    typical_step_s_ = typical_step_s_ > 0 ? 0.9 * typical_step_s_ + 0.1 * step : step;
    std::this_thread::sleep_for(std::chrono::duration<double>(step * (options_.throttle - 1)));
  }
  summary_.compute_s += Since(step_start_);
  summary_.steps_trained += 1;
  session_->set_step(t);
  return absl::OkStatus();
}

// The stats of the steps trained since the last report (after the reports, before the spike
// guard): the monitor and the service see them.
absl::Status IslandRun::OnStats(const std::vector<inner::StepStats>& steps) {
  const inner::StepStats& last = steps.back();
  monitor_->OnSteps(int64_t(steps.size()), last.loss, last.tokens, summary_.compute_s,
                    Since(start_));
  last_loss_ = last.loss;
  if (lead()) session_->set_telemetry(Telemetry(last.loss));
  return absl::OkStatus();
}

// A spike drops the local progress since the last sync, the steps after it included (they went
// on from the spiked parameters). The losses are the island's (reduced over its ranks): every
// rank takes the same decision. The local parameters since the last sync are not to be trusted:
// drop them (and, after a non-finite loss, the AdamW moments it poisoned) and go on from the
// global parameters. The next push carries only the steps after this report.
absl::Status IslandRun::OnSpike(int64_t step, const std::string& why, bool finite) {
  ATL_RETURN_IF_ERROR(outer_->ReloadGlobal());
  ATL_RETURN_IF_ERROR(model_->SyncReplicas());
  if (!finite) trainer_->optimizer().Reset();
  summary_.spikes += 1;
  summary_.stuck_reloads = outer_->stuck_reloads();
  progress_->Message(absl::StrFormat("%sstep %d: %s; reloaded the global parameters", label_,
                                     step, why));
  // The service hears of a reload of parameters reloaded before with the next heartbeat.
  if (lead()) session_->set_telemetry(Telemetry(last_loss_));
  return absl::OkStatus();
}

absl::StatusOr<bool> IslandRun::OuterStep(int64_t t) {
  const double steps_per_s = double(t) / std::max(1e-9, summary_.compute_s);
  ATL_RETURN_IF_ERROR(outer_->AfterStep(steps_per_s));
  ATL_RETURN_IF_ERROR(model_->SyncReplicas());
  return outer_->done();
}

// The loop's parts, in order: reports (rank 0's), the island's own, the spike guard;
// evaluations every train.eval_every steps and at the end (async islands evaluate the run's
// final parameters once every island has finished: Finish), checkpoints every
// train.checkpoint_every steps; a stop (SIGTERM on any rank) ends the island on every rank at the
// same step.
absl::Status IslandRun::Train() {
  if (lead()) reporter_.emplace(*metrics_, *progress_);
  StepReports reports(reporter_ ? &*reporter_ : nullptr, config_.train.log_every);
  inner::SpikeCheck spikes(config_.outer.spike_window, config_.outer.spike_factor,
                           [this](int64_t step, const std::string& why, bool finite) {
                             return OnSpike(step, why, finite);
                           });
  inner::Evaluation evaluation({train_.eval_every, /*at_end=*/!async_},
                               [this](int64_t t) { return Evaluate(t); });
  inner::Checkpoints checkpoints({CheckpointEvery(config_)}, [this](int64_t) {
    return checkpoints_->Save(/*background=*/true, Since(start_));
  });
  inner::StopSignal stop([this] { return ranks_->Any(options_.stop != nullptr && options_.stop->load()); });
  TimedSteps steps(*trainer_, summary_.compute_s);
  absl::Status s = inner::RunLoop(steps, outer_->max_steps(),
                                  {&reports, this, &spikes, &evaluation, &checkpoints, &stop});
  stopped_ = stop.stopped();
  return s;
}

// After the outer step's end, before the island leaves.
absl::Status IslandRun::WrapUp() {
  ATL_RETURN_IF_ERROR(model_->SyncReplicas());
  // Async islands, and sync ones whose global parameters moved on after their last step (another
  // island trained on after a failure), evaluate the run's final parameters.
  if (!stopped_ && (async_ || outer_->stats().caught_up_rounds > 0)) {
    ATL_RETURN_IF_ERROR(Evaluate(trainer_->step()));
  }
  // The last checkpoint is written before the island says it is done.
  if (auto s = checkpoints_->Save(/*background=*/false, Since(start_)); !s.ok()) {
    progress_->Message(absl::StrCat(label_, "warning: final checkpoint not written: ", s.message()));
  }
  progress_->Finish();
  return absl::OkStatus();
}

absl::StatusOr<IslandSummary> IslandRun::Finish() {
  ATL_RETURN_IF_ERROR(runtime_->Finish(stopped_, [this] { return WrapUp(); }));
  static_cast<outer::OuterStepStats&>(summary_) = outer_->stats();
  summary_.step = trainer_->step();
  summary_.tokens = trainer_->tokens();
  summary_.wall_s = Since(start_);
  summary_.checkpoints = checkpoints_->saved();
  summary_.checkpoint_stall_max_s = checkpoints_->stall_max_s();
  summary_.global_hash = outer_->global_hash();
  summary_.fragment_hashes = outer_->fragment_hashes();
  summary_.whole_fragments = mesh_->shape().size() == 1;
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
