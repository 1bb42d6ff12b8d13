#include "src/island_loop.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "outer/island_sync.h"
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

class StepReporter : public inner::LoopObserver {
 public:
  StepReporter(MetricsLog& metrics, Progress& progress, Clock::time_point start,
               const std::atomic<bool>* stop)
      : metrics_(metrics), progress_(progress), start_(start), stop_(stop) {}
  absl::Status OnStep(const inner::StepStats& step, const inner::EvalStats* eval) override {
    const double wall = Since(start_);
    metrics_.Write(StepRecord(step, eval, wall));
    progress_.OnStep(step, eval, wall);
    return absl::OkStatus();
  }

 private:
  MetricsLog& metrics_;
  Progress& progress_;
  Clock::time_point start_;
  const std::atomic<bool>* stop_;
};

}  // namespace

absl::StatusOr<IslandSummary> RunIsland(const Config& config, outer::Transport& transport,
                                        const IslandOptions& options) {
  // Everything that can be checked locally is checked before joining.
  auto data = inner::LoadDataset(config.data, config.model.context, config.model.vocab);
  if (!data.ok()) return data.status();
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  if (fs::exists(fs::path(options.run_dir) / "metrics.jsonl")) {
    return absl::AlreadyExistsError(
        absl::StrCat("run directory ", options.run_dir, " already holds an island's run"));
  }

  pb::JoinRequest join;
  join.set_run_id(config.outer.run_id);
  join.set_name(options.name);
  auto joined = transport.Join(join);
  if (!joined.ok()) {
    return absl::Status(joined.status().code(),
                        absl::StrCat("joining run '", config.outer.run_id, "': ",
                                     joined.status().message()));
  }
  const std::string island_id = joined->island_id();
  auto leave = [&] {
    pb::LeaveRequest l;
    l.set_run_id(config.outer.run_id);
    l.set_island_id(island_id);
    transport.Leave(l).IgnoreError();  // best effort: the service also drops silent islands
  };
  if (joined->config_hash() != ModelConfigHash(config.model)) {
    leave();
    return absl::FailedPreconditionError(
        "this island's [model] config differs from the coordinator's: both must build the same "
        "model");
  }
  const auto& schedule = joined->schedule();
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
  const NamedParams params = inner::NamedParameters(*(*trainer)->model());
  const auto layout = LayoutOf(params);
  if (joined->fragments_size() != 1 || joined->fragments(0).num_elements() != layout.total() ||
      joined->fragments(0).parameters_size() != int(layout.names.size())) {
    leave();
    return absl::FailedPreconditionError("the service's parameter layout differs from this model's");
  }

  outer::IslandSyncOptions sync_options;
  sync_options.codec = *compression::ParseCodec(config.outer.codec);  // validated with the config
  sync_options.error_feedback = config.outer.error_feedback;
  outer::IslandSync sync(&transport, config.outer.run_id, island_id, layout.total(), sync_options);
  if (auto s = sync.FetchGlobal(); !s.ok()) {
    leave();
    return s;
  }
  LoadFlat(sync.global(), params);

  std::error_code ec;
  fs::create_directories(options.run_dir, ec);
  WriteFileAtomic((fs::path(options.run_dir) / "config.toml").string(), ToToml(config))
      .IgnoreError();
  auto metrics = MetricsLog::Open((fs::path(options.run_dir) / "metrics.jsonl").string(), 0);
  if (!metrics.ok()) {
    leave();
    return metrics.status();
  }
  const std::string label = absl::StrCat("[", island_id, "] ");
  Progress progress(options.progress, options.tty, train.steps, config.run.log_every, label);
  progress.Message(absl::StrFormat(
      "%sjoined run '%s' at round %d: data stream %d of %d, H = %d, %d inner steps, %.2fM "
      "parameters",
      label, config.outer.run_id, sync.round(), joined->data_stream(),
      schedule.num_data_streams(), h, train.steps, double(layout.total()) / 1e6));

  const auto start = Clock::now();
  StepReporter reporter(**metrics, progress, start, options.stop);
  IslandSummary summary;
  summary.island_id = island_id;
  while ((*trainer)->step() < train.steps) {
    const int64_t from = (*trainer)->step();
    const int64_t until = std::min(train.steps, (from / h + 1) * h);
    const auto t0 = Clock::now();
    if (auto s = inner::RunLoop(**trainer, until, reporter, /*evaluate=*/false); !s.ok()) {
      leave();
      return s;
    }
    const double compute_s = Since(t0);
    const auto t1 = Clock::now();
    auto outcome = sync.SyncRound(Flatten(params),
                                  uint64_t(until - from) * uint64_t((*trainer)->tokens_per_step()));
    if (!outcome.ok()) {
      leave();
      return absl::Status(outcome.status().code(),
                          absl::StrCat("outer round ", sync.round(), ": ",
                                       outcome.status().message()));
    }
    LoadFlat(sync.global(), params);
    const double sync_s = Since(t1);
    summary.rounds += 1;
    summary.resyncs += outcome->resynced ? 1 : 0;
    summary.compute_s += compute_s;
    summary.sync_s += sync_s;
    summary.bytes_sent += outcome->bytes_sent;
    summary.bytes_received += outcome->bytes_received;

    nlohmann::json record = {{"round", outcome->round},
                             {"step", until},
                             {"tokens", (*trainer)->tokens()},
                             {"wall_s", Since(start)},
                             {"compute_s", compute_s},
                             {"sync_s", sync_s},
                             {"bytes_sent", outcome->bytes_sent},
                             {"bytes_received", outcome->bytes_received},
                             {"contributors", outcome->contributors},
                             {"global_hash", absl::StrFormat("%016x", sync.global_hash())},
                             {"resynced", outcome->resynced}};
    const int64_t every = train.eval_every;
    if ((every > 0 && until / every > from / every) || until == train.steps) {
      const auto eval = (*trainer)->Evaluate();
      summary.last_eval = eval;
      record["val_loss"] = eval.loss;
      record[eval.per_byte ? "val_bpb" : "val_bits_per_token"] = eval.bits;
    }
    (*metrics)->Write(record);
    std::string line = absl::StrFormat(
        "%sround %d/%d done at step %d: compute %.2fs, sync %.2fs, sent %s, %d contributors", label,
        outcome->round + 1, (train.steps + h - 1) / h, until, compute_s, sync_s,
        absl::StrCat(outcome->bytes_sent / 1024, " KiB"), outcome->contributors);
    if (record.contains("val_loss")) {
      line += absl::StrFormat(", val_loss %.4f", record["val_loss"].get<double>());
    }
    if (outcome->resynced) line += " (resynced: " + outcome->resync_reason + ")";
    progress.Message(line);
    if (options.stop != nullptr && options.stop->load()) break;
  }
  progress.Finish();
  leave();
  summary.step = (*trainer)->step();
  summary.tokens = (*trainer)->tokens();
  summary.wall_s = Since(start);
  summary.global_hash = sync.global_hash();
  nlohmann::json s = {{"island_id", island_id},
                      {"step", summary.step},
                      {"tokens", summary.tokens},
                      {"rounds", summary.rounds},
                      {"resyncs", summary.resyncs},
                      {"wall_s", summary.wall_s},
                      {"compute_s", summary.compute_s},
                      {"sync_s", summary.sync_s},
                      {"bytes_sent", summary.bytes_sent},
                      {"bytes_received", summary.bytes_received},
                      {"global_hash", absl::StrFormat("%016x", summary.global_hash)}};
  if (summary.last_eval) s["val_loss"] = summary.last_eval->loss;
  WriteFileAtomic((fs::path(options.run_dir) / "summary.json").string(), s.dump(2) + "\n")
      .IgnoreError();
  return summary;
}

}  // namespace atl
