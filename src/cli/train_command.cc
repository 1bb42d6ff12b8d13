#include "src/cli/train_command.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "src/store/checkpoint.h"
#include "src/observe/metrics.h"
#include "src/store/model_io.h"
#include "src/text/token_shards.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

// `atoll train`'s hooks of the loop: reports every step, evaluates every train.eval_every steps
// and at the last, checkpoints every train.checkpoint_every steps, stops on request. The steps'
// stats come over from the device every train.log_every steps, for an evaluation, a checkpoint
// and a stop. An evaluation's figures go into its step's record.
class TrainHooks : public inner::LoopHooks {
 public:
  TrainHooks(const Config& config, const TrainOptions& options, inner::Trainer& trainer,
             MetricsLog& metrics, Progress& progress, double wall_before)
      : config_(config),
        options_(options),
        trainer_(trainer),
        reporter_(metrics, progress, wall_before) {}

  bool StatsDue(int64_t step) const override {
    return step % config_.train.log_every == 0 || CheckpointDue(step, false) ||
           EvalDue(step, false) || stop_requested();
  }
  absl::Status OnStats(const std::vector<inner::StepStats>& steps) override {
    for (const auto& step : steps) {
      // The step an evaluation follows is reported with it.
      if (EvalDue(step.step, false)) {
        held_ = step;
        continue;
      }
      reporter_.Report(step, nullptr);
    }
    return absl::OkStatus();
  }
  bool EvalDue(int64_t step, bool) const override {
    const int64_t every = config_.train.eval_every;
    return (every > 0 && step % every == 0) || step == config_.train.steps;
  }
  absl::Status Evaluate(int64_t) override {
    ATL_ASSIGN_OR_RETURN(last_eval_, trainer_.Evaluate());
    if (held_) reporter_.Report(*held_, &*last_eval_);
    held_.reset();
    return absl::OkStatus();
  }
  bool CheckpointDue(int64_t step, bool) const override {
    const int64_t every = config_.train.checkpoint_every;
    return every > 0 && step % every == 0 && step < config_.train.steps;
  }
  absl::Status Checkpoint(int64_t) override { return SaveCheckpoint(); }
  absl::StatusOr<bool> Stop(int64_t) override {
    stopped_ = stop_requested();
    return stopped_;
  }
  bool stopped() const { return stopped_; }

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
  bool stop_requested() const { return options_.stop != nullptr && options_.stop->load(); }

  const Config& config_;
  const TrainOptions& options_;
  inner::Trainer& trainer_;
  StepReporter reporter_;
  std::optional<inner::StepStats> held_;
  std::optional<inner::EvalStats> last_eval_;
  bool stopped_ = false;  // by request (a stop at the last step too)
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
      options.resume ? absl::StrCat(" (resumed at step ", start_step, ")") : ""));
  TrainHooks hooks(config, options, *trainer, *metrics, progress, wall_before);
  const int64_t until = options.stop_after_step > 0
                            ? std::min(options.stop_after_step, config.train.steps)
                            : config.train.steps;
  absl::Status loop = inner::RunLoop(*trainer, until, hooks);
  progress.Finish();
  TrainSummary summary;
  summary.stopped = hooks.stopped() || trainer->step() < config.train.steps;
  if (!loop.ok() && !summary.stopped) return loop;
  ATL_RETURN_IF_ERROR(hooks.SaveCheckpoint());

  summary.step = trainer->step();
  summary.tokens = trainer->tokens();
  summary.wall_s = hooks.WallSeconds();
  summary.tokens_per_s = double(summary.tokens - start_step * trainer->tokens_per_step()) /
                         std::max(1e-9, hooks.ElapsedHere());
  summary.last_eval = hooks.last_eval();
  return summary;
}

}  // namespace atl
