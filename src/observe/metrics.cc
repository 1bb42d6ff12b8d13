#include "src/observe/metrics.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/status_macros.h"
#include "src/store/atomic_file.h"

namespace atl {

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(const std::string& path,
                                                             int64_t keep_through_step) {
  std::ifstream in(path);
  if (in) {
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded() && j.contains("step") && j["step"].get<int64_t>() > keep_through_step) {
        dropped = true;
        continue;
      }
      kept += line + "\n";
    }
    in.close();
    if (dropped) {
      ATL_RETURN_IF_ERROR(WriteFileAtomic(path, kept));
    }
  }
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot open ", path));
  return std::unique_ptr<MetricsLog>(new MetricsLog(f));
}

MetricsLog::~MetricsLog() { std::fclose(file_); }

void MetricsLog::Write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

nlohmann::json StepRecord(const inner::StepStats& s, const inner::EvalStats* eval, double wall_s) {
  nlohmann::json j = {{"step", s.step},         {"loss", s.loss},           {"lr", s.lr},
                      {"tokens", s.tokens},     {"wall_s", wall_s},         {"grad_norm", s.grad_norm},
                      {"step_s", s.compute_s}};
  if (eval != nullptr) AddEvalFields(*eval, &j);
  return j;
}

void AddEvalFields(const inner::EvalStats& eval, nlohmann::json* record) {
  (*record)["val_loss"] = eval.loss;
  if (!eval.per_byte) (*record)["val_bits_per_token"] = eval.bits;
  if (eval.bits_per_byte >= 0) (*record)["val_bpb"] = eval.bits_per_byte;
}

std::string EvalText(const inner::EvalStats& eval) {
  std::string text = absl::StrFormat("val_loss %.4f", eval.loss);
  if (!eval.per_byte) absl::StrAppendFormat(&text, " | bits/token %.4f", eval.bits);
  if (eval.bits_per_byte >= 0) absl::StrAppendFormat(&text, " | bpb %.4f", eval.bits_per_byte);
  return text;
}

StepReporter::StepReporter(MetricsLog& metrics, Progress& progress, double wall_before)
    : metrics_(metrics),
      progress_(progress),
      wall_before_(wall_before),
      start_(std::chrono::steady_clock::now()) {
  progress_.StartAt(wall_before);
}

void StepReporter::Report(const inner::StepStats& step, const inner::EvalStats* eval) {
  const double wall = wall_s();
  metrics_.Write(StepRecord(step, eval, wall));
  progress_.OnStep(step, eval, wall);
}

absl::Status StepReports::OnStats(const std::vector<inner::StepStats>& steps) {
  for (const auto& step : steps) {
    if (with_eval_ != nullptr && with_eval_->Due(step.step, false)) {
      held_ = step;  // reported with its evaluation
    } else if (reporter_ != nullptr) {
      reporter_->Report(step, nullptr);
    }
  }
  return absl::OkStatus();
}

void StepReports::ReportWithEval(const inner::EvalStats& eval) {
  if (held_ && reporter_ != nullptr) reporter_->Report(*held_, &eval);
  held_.reset();
}

double StepReporter::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

Progress::Progress(FILE* out, bool tty, int64_t total_steps, int64_t log_every, std::string label)
    : out_(out), tty_(tty), total_(total_steps), log_every_(log_every), label_(std::move(label)) {}

std::optional<std::string> RoundLines::Take(bool quick, double now_s) {
  if (quick && now_s - last_shown_s_ < interval_s_) {
    ++left_out_;
    return std::nullopt;
  }
  last_shown_s_ = now_s;
  const int64_t n = std::exchange(left_out_, 0);
  return n == 0 ? std::string() : absl::StrFormat(" (+%d warm-start rounds since the last line)", n);
}

void Progress::OnStep(const inner::StepStats& s, const inner::EvalStats* eval, double wall_s) {
  // The rate is taken between log steps: the steps between arrive together (their stats come
  // over from the device in one copy at each log step), the log steps a compute interval apart.
  const double tokens_per_step = s.step > 0 ? double(s.tokens) / double(s.step) : 0;
  if (last_tokens_ < 0) {  // the first step seen: the rate counts from the tokens before it
    last_tokens_ = s.tokens - int64_t(tokens_per_step);
    last_wall_ = start_wall_;
  }
  if (s.step % log_every_ == 0) {
    if (wall_s > last_wall_) {
      const double inst = double(s.tokens - last_tokens_) / (wall_s - last_wall_);
      rate_ = rate_ == 0 ? inst : 0.9 * rate_ + 0.1 * inst;
    }
    last_tokens_ = s.tokens;
    last_wall_ = wall_s;
  }
  const double eta = rate_ > 0 ? double(total_ - s.step) * tokens_per_step / rate_ : NAN;
  const std::string line =
      absl::StrFormat("%sstep %d/%d | loss %.4f | lr %.2e | %.1fk tok/s | ETA %s", label_, s.step,
                      total_, s.loss, s.lr, rate_ / 1000.0, FormatDuration(eta));
  if (eval != nullptr) {
    Message(absl::StrFormat("%sstep %d | %s | tokens %d | %s", label_, s.step, EvalText(*eval),
                            s.tokens, FormatDuration(wall_s)));
  }
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    line_open_ = true;
  } else if (s.step % log_every_ == 0 || s.step == total_) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void Progress::Message(const std::string& line) {
  if (line_open_) std::fprintf(out_, "\r\033[K");
  line_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void Progress::Finish() {
  if (line_open_) std::fprintf(out_, "\n");
  line_open_ = false;
  std::fflush(out_);
}

nlohmann::json TokenAccountJson(const outer::TokenAccount& a) {
  nlohmann::json j = {{"trained", a.trained},
                      {"on_time", a.on_time},
                      {"stale", a.stale},
                      {"recomputed", a.recomputed}};
  if (!a.refused.empty()) j["refused"] = a.refused;
  j["lost"] = a.lost();  // derived: trained less every other column
  return j;
}

outer::TokenAccount TokenAccountFromJson(const nlohmann::json& j) {
  outer::TokenAccount a;
  if (!j.is_object()) return a;
  auto number = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : uint64_t(0);
  };
  a.trained = number("trained");
  a.on_time = number("on_time");
  a.stale = number("stale");
  a.recomputed = number("recomputed");
  if (const auto it = j.find("refused"); it != j.end() && it->is_object()) {
    for (const auto& [reason, tokens] : it->items()) {
      if (tokens.is_number_unsigned()) a.refused[reason] += tokens.get<uint64_t>();
    }
  }
  return a;
}

}  // namespace atl
