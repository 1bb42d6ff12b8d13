#include "src/cli/train_command.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "src/store/checkpoint.h"
#include "src/observe/metrics.h"
#include "src/store/model_io.h"
#include "inner/loop_parts.h"
#include "src/text/token_shards.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// `atoll train`'s loop: reports every step, evaluates every train.eval_every steps and at the
// last (the step an evaluation follows is reported with its figures), checkpoints every
// train.checkpoint_every steps, stops on request. The steps' stats come over from the device
// every train.log_every steps, for an evaluation and a checkpoint.
class TrainLoop {
 public:
  TrainLoop(const Config& config, const TrainOptions& options, inner::Trainer& trainer,
            MetricsLog& metrics, Progress& progress, double wall_before)
      : config_(config),
        options_(options),
        trainer_(trainer),
        reporter_(metrics, progress, wall_before),
        evaluation_({config.train.eval_every, /*at_end=*/true, config.train.steps},
                    [this](int64_t) { return Evaluate(); }),
        checkpoints_({config.train.checkpoint_every, /*at_end=*/false, config.train.steps},
                     [this](int64_t) { return SaveCheckpoint(); }),
        reports_(&reporter_, config.train.log_every, &evaluation_),
        stop_([this]() -> absl::StatusOr<bool> {
          return options_.stop != nullptr && options_.stop->load();
        }) {}

  absl::Status Run(int64_t until) {
    return inner::RunLoop(trainer_, until, {&reports_, &evaluation_, &checkpoints_, &stop_});
  }

  absl::Status SaveCheckpoint() {
    const std::string path = CheckpointPath(options_.run_dir, trainer_.step());
    auto s = WriteCheckpointShard(path, 0, 1, trainer_.ExportState(), {WallSeconds(), ToToml(config_)});
    if (s.ok()) PruneCheckpoints(options_.run_dir, config_.train.checkpoint_keep);
    return s;
  }

  bool stopped() const { return stop_.stopped(); }  // by request (a stop at the last step too)
  double WallSeconds() const { return reporter_.wall_s(); }
  double ElapsedHere() const { return reporter_.elapsed_s(); }
  const std::optional<inner::EvalStats>& last_eval() const { return last_eval_; }

 private:
  absl::Status Evaluate() {
    ATL_ASSIGN_OR_RETURN(last_eval_, trainer_.Evaluate());
    reports_.ReportWithEval(*last_eval_);
    return absl::OkStatus();
  }

  const Config& config_;
  const TrainOptions& options_;
  inner::Trainer& trainer_;
  StepReporter reporter_;
  inner::Evaluation evaluation_;
  inner::Checkpoints checkpoints_;
  StepReports reports_;
  inner::StopSignal stop_;
  std::optional<inner::EvalStats> last_eval_;
};

}  // namespace

absl::StatusOr<TrainSummary> Train(const Config& config, const TrainOptions& options) {
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  ATL_ASSIGN_OR_RETURN(auto data,
                       text::LoadDataset(config.data, config.model));
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
      "atoll train: %d-layer %s, %.2fM parameters, %d tokens/step, %s, run dir %s%s",
      config.model.n_layer, inner::FamilyOf(config.model).title,
      double(inner::ParameterCount(config.model)) / 1e6,
      trainer->tokens_per_step(), config.data.path, options.run_dir,
      options.resume ? absl::StrCat(" (resumed at step ", start_step, ")")
      : config.train.init_from.empty() ? ""
                                       : absl::StrCat("; weights from train.init_from = ", config.train.init_from)));
  TrainLoop run(config, options, *trainer, *metrics, progress, wall_before);
  const int64_t until = options.stop_after_step > 0
                            ? std::min(options.stop_after_step, config.train.steps)
                            : config.train.steps;
  absl::Status loop = run.Run(until);
  progress.Finish();
  TrainSummary summary;
  summary.stopped = run.stopped() || trainer->step() < config.train.steps;
  if (!loop.ok() && !summary.stopped) return loop;
  ATL_RETURN_IF_ERROR(run.SaveCheckpoint());

  summary.step = trainer->step();
  summary.tokens = trainer->tokens();
  summary.wall_s = run.WallSeconds();
  summary.tokens_per_s = double(summary.tokens - start_step * trainer->tokens_per_step()) /
                         std::max(1e-9, run.ElapsedHere());
  summary.last_eval = run.last_eval();
  return summary;
}

}  // namespace atl
