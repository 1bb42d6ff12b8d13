#include "src/compare_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "compression/codec.h"
#include "inner/model.h"
#include "src/checkpoint.h"
#include "src/config.h"
#include "src/local_command.h"
#include "src/train_command.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

absl::StatusOr<MethodResult> Baseline(const Config& base, const CompareOptions& o) {
  Config c = base;
  c.train.grad_accum *= o.islands;  // global batch M x b: the same tokens per step as M islands
  TrainOptions t;
  t.run_dir = (fs::path(o.run_dir) / "baseline").string();
  t.stop = o.stop;
  std::fprintf(stderr, "atoll compare: baseline, one island with global batch %d x %d\n",
               o.islands, base.train.batch_size * base.train.grad_accum);
  auto summary = Train(c, t);
  if (!summary.ok()) return summary.status();
  if (summary->stopped) return absl::CancelledError("stopped by the user");
  MethodResult r;
  r.method = "baseline";
  r.val_loss = summary->last_eval ? summary->last_eval->loss : NAN;
  r.tokens = summary->tokens;
  r.wall_s = summary->wall_s;
  // What data-parallel training across the islands would send: a ring all-reduce of the fp32
  // gradients every step moves 2 (M - 1) / M of the model out of and into each island.
  const double model_bytes = 4.0 * double(inner::ParameterCount(c.model));
  r.wan_bytes = uint64_t(double(summary->step) * o.islands * 2.0 * 2.0 * (o.islands - 1) /
                         o.islands * model_bytes);
  r.note = absl::StrFormat(
      "WAN bytes are what data-parallel training across %d islands would move (ring all-reduce of "
      "fp32 gradients every step, sent + received); the run itself is one process.",
      o.islands);
  for (const auto& j : ReadJsonLines(t.run_dir + "/metrics.jsonl")) {
    if (j.contains("val_loss")) r.curve.emplace_back(j["tokens"].get<double>(), j["val_loss"].get<double>());
  }
  return r;
}

// "diloco" runs the config's outer settings; "diloco_<codec>" overrides the codec (e.g.
// diloco_fp4_e2m1); "streaming_<codec>" runs Streaming DiLoCo with that codec: the config's
// outer.num_fragments (4 when it is 1, at most one block per fragment), tau = 1, alpha = 0.5;
// "async" runs async DiLoCo (delayed Nesterov, dynamic local steps) with the config's settings.
absl::StatusOr<MethodResult> DiLoCo(const Config& c, const CompareOptions& o,
                                    const std::string& method) {
  LocalOptions l;
  l.islands = o.islands;
  l.config_path = o.config_path;
  l.overrides = o.overrides;
  l.throttle = o.throttle;
  if (method == "async") l.overrides.push_back("--outer.mode=async");
  if (absl::StartsWith(method, "diloco_")) l.overrides.push_back("--outer.codec=" + method.substr(7));
  if (absl::StartsWith(method, "streaming_")) {
    const int p = c.outer.num_fragments > 1 ? c.outer.num_fragments : std::min(4, c.model.n_layer);
    l.overrides.push_back("--outer.codec=" + method.substr(10));
    l.overrides.push_back(absl::StrCat("--outer.num_fragments=", p));
    l.overrides.push_back("--outer.fragment_sync_delay=1");
    l.overrides.push_back("--outer.fragment_update_alpha=0.5");
  }
  l.run_dir = (fs::path(o.run_dir) / method).string();
  l.stop = o.stop;
  l.out = stderr;
  std::string throttled;
  for (size_t i = 0; i < o.throttle.size(); ++i) {
    if (o.throttle[i] > 1) absl::StrAppend(&throttled, ", island", i, " throttled ", o.throttle[i], "x");
  }
  std::fprintf(stderr, "atoll compare: %s, %d islands, H = %d%s\n", method.c_str(), o.islands,
               c.outer.sync_every, throttled.c_str());
  auto local = RunLocal(l);
  if (!local.ok()) return local.status();
  MethodResult r;
  r.method = method;
  r.wall_s = local->wall_s;
  uint64_t peak = 0;
  double utilization = 0;
  std::map<uint32_t, int> staleness;  // async: contributions by staleness
  for (size_t i = 0; i < local->island_dirs.size(); ++i) {
    std::ifstream in(local->island_dirs[i] + "/summary.json");
    auto s = nlohmann::json::parse(in, nullptr, false);
    if (s.is_discarded()) return absl::DataLossError("missing island summary in " + local->island_dirs[i]);
    r.tokens += s["tokens"].get<int64_t>();
    peak = std::max<uint64_t>(peak, s.value("peak_bytes_in_flight", uint64_t(0)));
    utilization += s.value("utilization", 0.0);
    r.wan_bytes += s["bytes_sent"].get<uint64_t>() + s["bytes_received"].get<uint64_t>();
    if (s.contains("staleness")) {
      for (const auto& v : s["staleness"]) ++staleness[v.get<uint32_t>()];
    }
    if (i == 0) r.val_loss = s.value("val_loss", NAN);
  }
  for (const auto& j : ReadJsonLines(local->island_dirs[0] + "/metrics.jsonl")) {
    if (!j.contains("round") && j.contains("val_loss") && !j.contains("loss")) {
      // Async islands train at different rates: their records carry the run's tokens.
      const double tokens = j.contains("run_tokens") ? j["run_tokens"].get<double>()
                                                     : j["tokens"].get<double>() * o.islands;
      r.curve.emplace_back(tokens, j["val_loss"].get<double>());
    }
  }
  r.note = absl::StrFormat(
      "WAN bytes measured: payload bytes pushed and received by all islands over gRPC; val_loss "
      "of the global parameters after the last round; peak bytes in flight per island %d; "
      "compute utilization %.1f%%%s.",
      peak, 100.0 * utilization / double(local->island_dirs.size()), throttled);
  if (!staleness.empty()) {
    std::vector<std::string> parts;
    for (const auto& [s, n] : staleness) parts.push_back(absl::StrCat(s, ": ", n));
    absl::StrAppend(&r.note, " Staleness of the contributions (versions: count): ",
                    absl::StrJoin(parts, ", "), ".");
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<MethodResult>> RunCompare(const CompareOptions& o) {
  if (o.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  if (o.islands < 1) return absl::InvalidArgumentError("--islands must be >= 1");
  auto overrides = ParseOverrides(o.overrides);
  if (!overrides.ok()) return overrides.status();
  overrides->emplace_back("outer.islands", std::to_string(o.islands));
  auto config = LoadConfig(o.config_path, *overrides);
  if (!config.ok()) return config.status();
  // Check the data before starting anything.
  if (auto d = inner::LoadDataset(config->data, config->model.context, config->model.vocab); !d.ok()) {
    return d.status();
  }
  if (fs::exists(o.run_dir) && !fs::is_empty(o.run_dir)) {
    return absl::AlreadyExistsError(absl::StrCat("run directory ", o.run_dir, " is not empty"));
  }
  std::vector<MethodResult> results;
  for (absl::string_view m : absl::StrSplit(config->compare.methods, ',', absl::SkipEmpty())) {
    absl::StatusOr<MethodResult> r;
    if (m == "baseline") {
      r = Baseline(*config, o);
    } else if (m == "diloco" || m == "async" ||
               (absl::StartsWith(m, "diloco_") && compression::ParseCodec(std::string(m.substr(7))).ok()) ||
               (absl::StartsWith(m, "streaming_") &&
                compression::ParseCodec(std::string(m.substr(10))).ok())) {
      r = DiLoCo(*config, o, std::string(m));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("compare.methods: unknown method '", m, "'"));
    }
    if (!r.ok()) return r.status();
    results.push_back(*std::move(r));
  }
  const std::string title =
      absl::StrFormat("atoll compare: %d islands, %d inner steps, H = %d (%s)", o.islands,
                      config->train.steps, config->outer.sync_every, o.config_path);
  const fs::path dir(o.run_dir);
  for (auto [name, text] : {std::pair<const char*, std::string>{"report.md", ReportMarkdown(results, title)},
                            {"report.csv", ReportCsv(results)},
                            {"loss.svg", LossPlotSvg(results, title)}}) {
    if (auto s = WriteFileAtomic((dir / name).string(), text); !s.ok()) return s;
  }
  std::printf("%s", ReportMarkdown(results, title).c_str());
  std::printf("\nwrote %s/report.md, report.csv, loss.svg\n", o.run_dir.c_str());
  return results;
}

}  // namespace atl
