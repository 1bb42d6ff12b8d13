#include "src/cli/train_command.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "src/store/checkpoint.h"
#include "src/observe/metrics.h"
#include "src/store/model_io.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// Reports every step, checkpoints every run.checkpoint_every steps, stops on request. The steps'
// stats come over from the device every train.log_every steps, at checkpoints and at a stop.
class TrainObserver : public inner::LoopObserver {
 public:
  TrainObserver(const Config& config, const TrainOptions& options, inner::Trainer& trainer,
                MetricsLog& metrics, Progress& progress, double wall_before)
      : config_(config),
        options_(options),
        trainer_(trainer),
        reporter_(metrics, progress, wall_before) {}

  absl::Status OnStep(const inner::StepStats& step, const inner::EvalStats* eval) override {
    ATL_RETURN_IF_ERROR(reporter_.OnStep(step, eval));
    if (eval != nullptr) last_eval_ = *eval;
    const int64_t every = config_.train.checkpoint_every;
    if (every > 0 && step.step % every == 0 && step.step < config_.train.steps) {
      ATL_RETURN_IF_ERROR(SaveCheckpoint());
    }
    // The trainer's last step (the last of those reported together) is where a stop ends.
    if (step.step == trainer_.step() && options_.stop != nullptr && options_.stop->load()) {
      return absl::CancelledError("stop requested");
    }
    return absl::OkStatus();
  }
  bool NeedsStats(int64_t step) const override {
    const int64_t every = config_.train.checkpoint_every;
    return step % config_.train.log_every == 0 || (every > 0 && step % every == 0) ||
           (options_.stop != nullptr && options_.stop->load());
  }

  absl::Status SaveCheckpoint() {
    const std::string path = CheckpointPath(options_.run_dir, trainer_.step());
    auto s = WriteCheckpointShard(path, 0, 1, trainer_.ExportState(), {WallSeconds(), ToToml(config_)});
    if (s.ok()) PruneCheckpoints(options_.run_dir, config_.train.checkpoint_keep);
    return s;
  }

  double WallSeconds() const { return reporter_.wall_s(); }
  double ElapsedHere() const { return reporter_.elapsed_s(); }
  const std::optional<inner::EvalStats>& last_eval() const { return last_eval_; }

 private:
  const Config& config_;
  const TrainOptions& options_;
  inner::Trainer& trainer_;
  StepReporter reporter_;
  std::optional<inner::EvalStats> last_eval_;
};

}  // namespace

absl::StatusOr<TrainSummary> Train(const Config& config, const TrainOptions& options) {
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  ATL_ASSIGN_OR_RETURN(auto data,
                       inner::LoadDataset(config.data, config.model.context, config.model.vocab));
  ATL_ASSIGN_OR_RETURN(auto trainer,
                       inner::Trainer::Create(config.trainer(), data));

  // Resume, or refuse to overwrite an earlier run; all before anything is written.
  double wall_before = 0;
  const fs::path run_dir(options.run_dir);
  if (options.resume) {
    auto latest = LatestCheckpoint(options.run_dir);
    if (!latest.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--resume: ", latest.status().message()));
    }
    ATL_ASSIGN_OR_RETURN(auto ckpt, ReadCheckpoint(*latest));
    if (auto s = trainer->ImportState(ckpt.state); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(*latest, " does not fit this config: ", s.message()));
    }
    wall_before = ckpt.meta.wall_s;
  } else if (fs::exists(run_dir / "metrics.jsonl") || fs::exists(run_dir / "checkpoints")) {
    return absl::AlreadyExistsError(absl::StrCat(
        "run directory ", options.run_dir,
        " already holds a run: pass --resume to continue it, or choose another --run-dir"));
  } else if (!config.train.init_from.empty()) {
    ATL_ASSIGN_OR_RETURN(auto weights, InitialWeights(config));
    inner::TrainerState state = trainer->ExportState();
    ATL_RETURN_IF_ERROR(CopyInto(weights, state));
    ATL_RETURN_IF_ERROR(trainer->ImportState(state));
  }

  std::error_code ec;
  fs::create_directories(run_dir / "checkpoints", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", options.run_dir, ": ", ec.message()));
  ATL_RETURN_IF_ERROR(WriteFileAtomic((run_dir / "config.toml").string(), ToToml(config)));
  ATL_ASSIGN_OR_RETURN(auto metrics,
                       MetricsLog::Open((run_dir / "metrics.jsonl").string(), trainer->step()));

  const int64_t start_step = trainer->step();
  Progress progress(options.progress, options.tty, config.train.steps, config.train.log_every, "");
  progress.Message(absl::StrFormat(
      "atoll train: %d-layer GPT, %.2fM parameters, %d tokens/step, %s, run dir %s%s",
      config.model.n_layer, double(inner::ParameterCount(config.model)) / 1e6,
      trainer->tokens_per_step(), config.data.path, options.run_dir,
      options.resume ? absl::StrCat(" (resumed at step ", start_step, ")") : ""));
  TrainObserver observer(config, options, *trainer, *metrics, progress, wall_before);
  const int64_t until = options.stop_after_step > 0
                            ? std::min(options.stop_after_step, config.train.steps)
                            : config.train.steps;
  absl::Status loop = inner::RunLoop(*trainer, until, observer);
  progress.Finish();
  TrainSummary summary;
  summary.stopped = absl::IsCancelled(loop) || trainer->step() < config.train.steps;
  if (!loop.ok() && !summary.stopped) return loop;
  ATL_RETURN_IF_ERROR(observer.SaveCheckpoint());

  summary.step = trainer->step();
  summary.tokens = trainer->tokens();
  summary.wall_s = observer.WallSeconds();
  summary.tokens_per_s = double(summary.tokens - start_step * trainer->tokens_per_step()) /
                         std::max(1e-9, observer.ElapsedHere());
  summary.last_eval = observer.last_eval();
  return summary;
}

}  // namespace atl
