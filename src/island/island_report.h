// Internal to src/island: what an island writes besides its training — checkpoints taken in the
// background, the record and progress line of each merged round, summary.json.
#ifndef ATOLL_SRC_ISLAND_ISLAND_REPORT_H_
#define ATOLL_SRC_ISLAND_ISLAND_REPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "outer/island/outer_step.h"
#include "src/config/config.h"
#include "src/island/island_loop.h"

namespace atl {

using IslandClock = std::chrono::steady_clock;
// Seconds since t.
inline double Since(IslandClock::time_point t) {
  return std::chrono::duration<double>(IslandClock::now() - t).count();
}

class IslandMonitor;
class MetricsLog;
class Progress;

// Checkpoints: the training thread copies the island's state to CPU memory (the only stall) and a
// background task writes it (temp file, fsync, rename) while training goes on. Each rank writes
// its part; the checkpoint counts once every rank's part is there.
// With error feedback the residuals are part of it (`residuals`: the outer step hook's).
class CheckpointHook {
 public:
  using Residuals = std::function<std::vector<outer::OuterStepHook::Residual>()>;
  CheckpointHook(const Config& config, const IslandOptions& options, inner::Trainer& trainer,
                 Progress& progress, std::string label, IslandMonitor& monitor,
                 Residuals residuals = nullptr);
  ~CheckpointHook();

  absl::Status Save(bool background, double wall_s);
  uint64_t saved() const { return saved_; }
  double stall_max_s() const { return stall_max_s_; }

 private:
  void Wait();
  const Config& config_;
  const IslandOptions& options_;
  inner::Trainer& trainer_;
  Progress& progress_;
  const std::string label_;
  IslandMonitor& monitor_;
  Residuals residuals_;
  std::future<absl::Status> writing_;
  uint64_t saved_ = 0;
  double stall_max_s_ = 0;
};

// Error-feedback residuals in a checkpoint: tensors "outer/residual/<fragment>", one slice per
// owned range (offsets within the fragment), so that a checkpoint of N ranks resumes on M.
void AppendResiduals(const std::vector<outer::OuterStepHook::Residual>& residuals,
                     inner::TrainerState& state);
std::vector<outer::OuterStepHook::Residual> ResidualsOf(const inner::TrainerState& state);

// The metrics record and the progress line of a merged round; `shown`: the line's suffix (RoundLines),
// nullopt: no line.
void ReportRound(const outer::LandedRound& r, bool async, int64_t tokens, double wall_s,
                 MetricsLog& metrics, Progress& progress, const std::string& label,
                 const std::optional<std::string>& shown);

// RUN_DIR/summary.json of the island (rank 0's).
void WriteSummary(const IslandOptions& options, const IslandSummary& summary, bool async,
                  int ranks);

}  // namespace atl

#endif  // ATOLL_SRC_ISLAND_ISLAND_REPORT_H_
