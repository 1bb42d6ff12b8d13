// What a run reports: JSON Lines metrics in RUN_DIR/metrics.jsonl and a human progress view (one
// updating line on a terminal, periodic plain lines otherwise).
#ifndef ATOLL_SRC_OBSERVE_METRICS_H_
#define ATOLL_SRC_OBSERVE_METRICS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include <optional>
#include <vector>

#include "inner/loop.h"
#include "inner/loop_parts.h"
#include "outer/service/token_ledger.h"

namespace atl {

class MetricsLog {
 public:
  // Appends to `path`. Records of steps after `keep_through_step` (left by a run that went past
  // its last checkpoint) are dropped first, so a resumed run's log has each step once.
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(const std::string& path,
                                                          int64_t keep_through_step);
  ~MetricsLog();
  void Write(const nlohmann::json& record);

 private:
  explicit MetricsLog(FILE* f) : file_(f) {}
  FILE* file_;
};

// The metrics record of one step: step, loss, lr, tokens, wall_s, and val_* on evaluation steps.
nlohmann::json StepRecord(const inner::StepStats& step, const inner::EvalStats* eval, double wall_s);
// An evaluation's fields of a metrics record: val_loss; val_bits_per_token (token shards);
// val_bpb, bits per byte of text, whenever known (bytes, or shards with their tokenizer).
void AddEvalFields(const inner::EvalStats& eval, nlohmann::json* record);
// "val_loss 2.4767 | bpb 3.5731" and the like, for progress lines.
std::string EvalText(const inner::EvalStats& eval);

// A token account (outer/service/token_ledger.h) as JSON ({"trained", "on_time", "stale",
// "recomputed", "refused": {reason: tokens}}), and back (keys missing: 0).
nlohmann::json TokenAccountJson(const outer::TokenAccount& account);
outer::TokenAccount TokenAccountFromJson(const nlohmann::json& j);
// Bits per parameter and round: 8 x bytes over the parameters the rounds carried (0: none yet).
inline double BitsPerParam(uint64_t bytes, uint64_t elements) {
  return elements > 0 ? 8.0 * double(bytes) / double(elements) : 0.0;
}

class Progress {
 public:
  Progress(FILE* out, bool tty, int64_t total_steps, int64_t log_every, std::string label);
  void OnStep(const inner::StepStats& step, const inner::EvalStats* eval, double wall_s);
  void Message(const std::string& line);  // a persistent line (clears the updating one first)
  void Finish();
  // When the steps began (the run's wall time, after a resume its time before): the first line's
  // rate counts from here, so it is a measured one, not 0.
  void StartAt(double wall_s) { start_wall_ = wall_s; }

 private:
  FILE* out_;
  bool tty_;
  int64_t total_, log_every_;
  std::string label_;
  double rate_ = 0;  // smoothed tokens/s
  int64_t last_tokens_ = -1;
  double last_wall_ = 0;
  double start_wall_ = 0;
  bool line_open_ = false;
};

// Lines a person can read when rounds come faster than they can (the warm start's one-step rounds,
// every fragment each step): such a round's line is shown at most once per `interval_s`, and the
// shown one says how many it stands for. Other rounds' lines are always shown.
class RoundLines {
 public:
  explicit RoundLines(double interval_s = 1.0) : interval_s_(interval_s) {}
  // nullopt: leave this round's line out; else the text to append to it ("" or
  // " (+12 warm-start rounds since the last line)"). `quick`: the round may be left out.
  std::optional<std::string> Take(bool quick, double now_s);

 private:
  double interval_s_;
  double last_shown_s_ = -1e300;
  int64_t left_out_ = 0;
};

// The per-step report of every training loop: a metrics record and a progress update. Wall time
// counts from construction, plus `wall_before` (the time of a run resumed from a checkpoint).
class StepReporter {
 public:
  StepReporter(MetricsLog& metrics, Progress& progress, double wall_before = 0);
  void Report(const inner::StepStats& step, const inner::EvalStats* eval);
  double elapsed_s() const;
  double wall_s() const { return wall_before_ + elapsed_s(); }

 private:
  MetricsLog& metrics_;
  Progress& progress_;
  double wall_before_;
  std::chrono::steady_clock::time_point start_;
};

// The loop's part that reports every step (inner/loop.h): the steps' stats come over every
// `log_every` steps. With `with_eval`, the step an evaluation follows is held and reported with
// the evaluation's figures (ReportWithEval) in one record. `reporter` null: this rank reports
// nothing, but its stats come over when every rank's do.
class StepReports : public inner::LoopPart {
 public:
  StepReports(StepReporter* reporter, int64_t log_every,
              const inner::Evaluation* with_eval = nullptr)
      : reporter_(reporter), log_every_(log_every), with_eval_(with_eval) {}
  bool StatsDue(int64_t step) const override { return step % log_every_ == 0; }
  absl::Status OnStats(const std::vector<inner::StepStats>& steps) override;
  void ReportWithEval(const inner::EvalStats& eval);

 private:
  StepReporter* reporter_;
  int64_t log_every_;
  const inner::Evaluation* with_eval_;
  std::optional<inner::StepStats> held_;
};

std::string FormatDuration(double seconds);

}  // namespace atl

#endif  // ATOLL_SRC_OBSERVE_METRICS_H_
