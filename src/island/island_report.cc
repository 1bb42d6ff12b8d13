#include "src/island/island_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <tuple>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/observe/metrics.h"
#include "src/observe/monitoring.h"
#include "src/store/checkpoint.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
using Clock = IslandClock;

}  // namespace

CheckpointHook::CheckpointHook(const Config& config, const IslandOptions& options,
                               inner::Trainer& trainer, Progress& progress, std::string label,
                               IslandMonitor& monitor, Residuals residuals)
    : config_(config),
      options_(options),
      trainer_(trainer),
      progress_(progress),
      label_(std::move(label)),
      monitor_(monitor),
      residuals_(std::move(residuals)) {}

CheckpointHook::~CheckpointHook() { Wait(); }

absl::Status CheckpointHook::Save(bool background, double wall_s) {
  Wait();
  const auto t0 = Clock::now();
  inner::TrainerState state = trainer_.ExportState();
  if (residuals_) AppendResiduals(residuals_(), state);
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

namespace {
constexpr char kResidualPrefix[] = "outer/residual/";
}  // namespace

void AppendResiduals(const std::vector<outer::OuterStepHook::Residual>& residuals,
                     inner::TrainerState& state) {
  for (const auto& r : residuals) {
    uint64_t at = 0;
    for (const auto& [begin, end] : r.ranges) {
      inner::TensorSlice slice;
      slice.name = absl::StrCat(kResidualPrefix, r.fragment);
      slice.values = torch::from_blob(const_cast<float*>(r.values.data()) + at,
                                      {int64_t(end - begin)}, torch::kFloat32)
                         .clone();
      slice.offset = int64_t(begin);
      slice.shape = {int64_t(r.fragment_elements)};
      state.tensors.push_back(std::move(slice));
      at += end - begin;
    }
  }
}

std::vector<outer::OuterStepHook::Residual> ResidualsOf(const inner::TrainerState& state) {
  std::vector<outer::OuterStepHook::Residual> out;
  for (const auto& t : state.tensors) {
    if (t.name.rfind(kResidualPrefix, 0) != 0 || t.shape.size() != 1) continue;
    uint32_t fragment = 0;
    if (!absl::SimpleAtoi(t.name.substr(sizeof(kResidualPrefix) - 1), &fragment)) continue;
    const at::Tensor v = t.values.to(torch::kFloat32).contiguous();
    outer::OuterStepHook::Residual r;
    r.fragment = fragment;
    r.fragment_elements = uint64_t(t.shape[0]);
    r.ranges = {{uint64_t(t.offset), uint64_t(t.offset + v.numel())}};
    r.values.assign(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
    out.push_back(std::move(r));
  }
  return out;
}

void CheckpointHook::Wait() {
  if (!writing_.valid()) return;
  if (auto s = writing_.get(); !s.ok()) {
    progress_.Message(absl::StrCat(label_, "warning: checkpoint not written: ", s.message()));
  }
}

namespace {

nlohmann::json RangeHashesJson(const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& ranges) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [b, e, h] : ranges) j[absl::StrCat(b, "-", e)] = absl::StrFormat("%016x", h);
  return j;
}

}  // namespace

// The metrics record and the progress line of a merged round.
void ReportRound(const outer::LandedRound& r, bool async, int64_t tokens, double wall_s,
                 MetricsLog& metrics, Progress& progress, const std::string& label,
                 const std::optional<std::string>& shown) {
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
                 {"bits_per_param_sent", BitsPerParam(o.bytes_sent, o.elements)},
                 {"bits_per_param_received", BitsPerParam(o.bytes_received, o.elements)},
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
                  label, r.fragment, o.round, r.step, r.pushed_at, r.idle_s,
                  o.bytes_sent / 1024, o.contributors);
  if (o.resynced) line += " (resynced: " + o.resync_reason + ")";
  if (!o.moments.empty()) line += ", optimizer moments averaged";
  if (shown) progress.Message(line + *shown);
}

void WriteSummary(const IslandOptions& options, const IslandSummary& summary, bool async,
                  int ranks) {
  nlohmann::json s = {{"island_id", summary.island_id},
                      {"step", summary.step},
                      {"tokens", summary.tokens},
                      {"rounds", summary.rounds},
                      {"resyncs", summary.resyncs},
                      {"rejoins", summary.rejoins},
                      {"late_pushes", summary.late_pushes},
                      {"moment_rounds", summary.moment_rounds},
                      {"spikes", summary.spikes},
                      {"stuck_reloads", summary.stuck_reloads},
                      {"checkpoints", summary.checkpoints},
                      {"checkpoint_stall_ms", 1e3 * summary.checkpoint_stall_max_s},
                      {"steps_trained", summary.steps_trained},
                      {"step_ms", 1e3 * summary.compute_s /
                                      std::max<double>(1, double(summary.steps_trained))},
                      {"wall_s", summary.wall_s},
                      {"compute_s", summary.compute_s},
                      {"sync_s", summary.idle_s},
                      {"bytes_sent", summary.bytes_sent},
                      {"bytes_received", summary.bytes_received},
                      // Per parameter and round, each way: indices, scales and headers included.
                      {"bits_per_param_sent", BitsPerParam(summary.bytes_sent, summary.elements_synced)},
                      {"bits_per_param_received",
                       BitsPerParam(summary.bytes_received, summary.elements_synced)},
                      {"peak_bytes_in_flight", summary.peak_bytes_in_flight},
                      {"tau", summary.tau},
                      {"link_mbps", summary.link_bps / 1e6},
                      {"utilization", summary.compute_s / std::max(1e-9, summary.wall_s)},
                      {"throttle", options.throttle},
                      {"ranks", ranks},
                      // With several ranks: of rank 0's part (each rank logs its ranges' hashes).
                      {"global_hash", absl::StrFormat("%016x", summary.global_hash)},
                      {"global_copy", summary.global_copy}};
  if (summary.last_eval) {
    s["val_loss"] = summary.last_eval->loss;
    if (summary.last_eval->bits_per_byte >= 0) s["val_bpb"] = summary.last_eval->bits_per_byte;
  }
  if (async) {
    s["staleness"] = summary.staleness;
    s["run_tokens"] = summary.run_tokens;
  }
  WriteFileAtomic((fs::path(options.run_dir) / "summary.json").string(), s.dump(2) + "\n")
      .IgnoreError();
}


}  // namespace atl
