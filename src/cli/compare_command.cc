#include "src/cli/compare_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "compression/status_macros.h"
#include "inner/model.h"
#include "src/store/checkpoint.h"
#include "src/config/config.h"
#include "src/cli/compare_methods.h"
#include "src/cli/local_command.h"
#include "src/cli/results.h"
#include "src/cli/train_command.h"
#include "src/text/token_shards.h"

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

absl::StatusOr<MethodResult> Baseline(const Config& base, const CompareOptions& o,
                                      const std::string& dir) {
  Config c = base;
  const int islands = base.outer.islands;  // M: --islands, or this run's outer.islands
  c.train.grad_accum *= islands;  // global batch M x b: the same tokens per step as M islands
  TrainOptions t;
  t.run_dir = dir;
  t.stop = o.stop;
  std::fprintf(stderr, "atoll compare: baseline, one island with global batch %d x %d\n",
               islands, base.train.batch_size * base.train.grad_accum);
  ATL_ASSIGN_OR_RETURN(auto summary, Train(c, t));
  if (summary.stopped) return absl::CancelledError("stopped by the user");
  MethodResult r;
  r.method = "baseline";
  r.val_loss = summary.last_eval ? summary.last_eval->loss : NAN;
  if (summary.last_eval && summary.last_eval->bits_per_byte >= 0) r.val_bpb = summary.last_eval->bits_per_byte;
  r.tokens = summary.tokens;
  r.wall_s = summary.wall_s;
  // What data-parallel training across the islands would send: a ring all-reduce of the fp32
  // gradients every step moves 2 (M - 1) / M of the model out of and into each island.
  const double model_bytes = 4.0 * double(inner::ParameterCount(c.model));
  r.wan_bytes =
      uint64_t(double(summary.step) * islands * 2.0 * 2.0 * (islands - 1) / islands * model_bytes);
  r.note = absl::StrFormat(
      "WAN bytes are what data-parallel training across %d islands would move (ring all-reduce of "
      "fp32 gradients every step, sent + received); the run itself is one process.",
      islands);
  for (const auto& j : ReadJsonLines(t.run_dir + "/metrics.jsonl")) {
    if (j.contains("val_loss")) r.curve.emplace_back(j["tokens"].get<double>(), j["val_loss"].get<double>());
  }
  return r;
}

absl::StatusOr<MethodResult> DiLoCo(const Config& c, const CompareOptions& o,
                                    const Method& method, const std::vector<Override>& point,
                                    const std::string& dir) {
  LocalOptions l;
  l.islands = c.outer.islands;
  l.config_path = o.config_path;
  l.overrides = o.overrides;
  for (const auto& [key, value] : point) l.overrides.push_back(absl::StrCat("--", key, "=", value));
  for (const auto& [key, value] : ChangesOf(method, c).overrides) {
    l.overrides.push_back(absl::StrCat("--", key, "=", value));
  }
  l.throttle = o.throttle;
  l.run_dir = dir;
  l.stop = o.stop;
  l.out = stderr;
  std::string throttled;
  for (size_t i = 0; i < o.throttle.size(); ++i) {
    if (o.throttle[i] > 1) absl::StrAppend(&throttled, ", island", i, " throttled ", o.throttle[i], "x");
  }
  std::fprintf(stderr, "atoll compare: %s, %d islands, H = %d%s\n", method.name.c_str(), l.islands,
               c.outer.sync_every, throttled.c_str());
  ATL_ASSIGN_OR_RETURN(auto local, RunLocal(l));
  MethodResult r;
  r.method = method.name;
  r.wall_s = local.wall_s;
  uint64_t peak = 0;
  double utilization = 0;
  std::map<uint32_t, int> staleness;  // async: contributions by staleness
  double bits_up = 0, bits_down = 0;   // per parameter and round, summed over islands
  for (size_t i = 0; i < local.island_dirs.size(); ++i) {
    std::ifstream in(local.island_dirs[i] + "/summary.json");
    auto s = nlohmann::json::parse(in, nullptr, false);
    if (s.is_discarded())
      return absl::DataLossError("missing island summary in " + local.island_dirs[i]);
    r.tokens += s["tokens"].get<int64_t>();
    peak = std::max<uint64_t>(peak, s.value("peak_bytes_in_flight", uint64_t(0)));
    utilization += s.value("utilization", 0.0);
    r.wan_bytes += s["bytes_sent"].get<uint64_t>() + s["bytes_received"].get<uint64_t>();
    r.bytes_up += s["bytes_sent"].get<uint64_t>();
    r.bytes_down += s["bytes_received"].get<uint64_t>();
    bits_up += s.value("bits_per_param_sent", 0.0);
    bits_down += s.value("bits_per_param_received", 0.0);
    if (s.contains("staleness")) {
      for (const auto& v : s["staleness"]) ++staleness[v.get<uint32_t>()];
    }
    if (i == 0) {
      r.val_loss = s.value("val_loss", NAN);
      r.val_bpb = s.value("val_bpb", NAN);
    }
  }
  for (const auto& j : ReadJsonLines(local.island_dirs[0] + "/metrics.jsonl")) {
    if (!j.contains("round") && j.contains("val_loss") && !j.contains("loss")) {
      // Async islands train at different rates: their records carry the run's tokens.
      const double tokens = j.contains("run_tokens") ? j["run_tokens"].get<double>()
                                                     : j["tokens"].get<double>() * l.islands;
      r.curve.emplace_back(tokens, j["val_loss"].get<double>());
    }
  }
  const double islands = double(std::max<size_t>(1, local.island_dirs.size()));
  r.bits_up = bits_up / islands;
  r.bits_down = bits_down / islands;
  r.note = absl::StrFormat(
      "WAN bytes measured: payload bytes pushed and received by all islands over gRPC; val_loss "
      "of the global parameters after the last round; peak bytes in flight per island %d; "
      "compute utilization %.1f%%%s.",
      peak, 100.0 * utilization / double(local.island_dirs.size()), throttled);
  if (!staleness.empty()) {
    std::vector<std::string> parts;
    for (const auto& [s, n] : staleness) parts.push_back(absl::StrCat(s, ": ", n));
    absl::StrAppend(&r.note, " Staleness of the contributions (versions: count): ",
                    absl::StrJoin(parts, ", "), ".");
  }
  return r;
}

struct Sweep {
  std::string key;
  std::vector<std::string> values;
};

// "optim.lr=1e-3,2e-3": each value checked by loading the config with it (errors name the key).
absl::StatusOr<std::vector<Sweep>> ParseSweeps(const CompareOptions& o,
                                               const std::vector<Override>& overrides) {
  std::vector<Sweep> sweeps;
  for (const auto& spec : o.sweeps) {
    const auto eq = spec.find('=');
    Sweep sweep;
    sweep.key = spec.substr(0, eq);
    if (eq != std::string::npos) {
      sweep.values = absl::StrSplit(spec.substr(eq + 1), ',', absl::SkipEmpty());
    }
    if (eq == std::string::npos || sweep.values.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sweep '", spec, "' is not KEY=VALUE,VALUE,... (e.g. optim.lr=1e-3,3e-3)"));
    }
    for (const auto& other : sweeps) {
      if (other.key == sweep.key) return absl::InvalidArgumentError("--sweep " + sweep.key + " given twice");
    }
    for (const auto& value : sweep.values) {
      auto with = overrides;
      with.emplace_back(sweep.key, value);
      if (auto c = LoadConfig(o.config_path, with, ConfigChecks::kKeys); !c.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--sweep ", sweep.key, "=", value, ": ",
                                                       c.status().message()));
      }
    }
    sweeps.push_back(std::move(sweep));
  }
  return sweeps;
}

// The baseline has no outer loop: of the outer.* keys only the island count (its global batch is
// M x b) changes it.
bool ChangesBaseline(const std::string& key) {
  return !absl::StartsWith(key, "outer.") || key == "outer.islands";
}

// The settings `method` runs: every combination of the sweeps that can change it.
std::vector<std::vector<Override>> GridFor(const Method& method, const std::vector<Sweep>& sweeps) {
  std::vector<std::vector<Override>> grid = {{}};
  for (const auto& sweep : sweeps) {
    if (method.kind == MethodKind::kBaseline && !ChangesBaseline(sweep.key)) continue;
    std::vector<std::vector<Override>> next;
    for (const auto& point : grid) {
      for (const auto& value : sweep.values) {
        next.push_back(point);
        next.back().emplace_back(sweep.key, value);
      }
    }
    grid = std::move(next);
  }
  return grid;
}

std::string SettingOf(const std::vector<Override>& point) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : point) parts.push_back(absl::StrCat(key, "=", value));
  return absl::StrJoin(parts, " ");
}

// RUN_DIR/<method>, or RUN_DIR/<method>/<key=value,...> in a sweep.
std::string RunDirOf(const std::string& run_dir, const std::string& method, const std::string& setting) {
  fs::path dir = fs::path(run_dir) / method;
  if (setting.empty()) return dir.string();
  std::string name = setting;
  for (char& c : name) {
    if (c == ' ') c = ',';
    if (c == '/') c = '_';
  }
  return (dir / name).string();
}

// What makes two compares the same: resuming one is allowed, mixing two is not.
nlohmann::json Manifest(const Config& config, const CompareOptions& o, const std::vector<Sweep>& sweeps) {
  nlohmann::json j = {{"config", ToToml(config)}, {"islands", o.islands}, {"throttle", o.throttle}};
  for (const auto& sweep : sweeps) j["sweeps"][sweep.key] = sweep.values;
  return j;
}

// Whether a directory's manifest is this compare's. Its config is compared as this build reads it,
// so that a manifest written by an earlier build (another key order, a key added since with its
// default) still resumes.
bool SameCompare(nlohmann::json found, const nlohmann::json& want) {
  if (!found.is_object() || !found.contains("config") || !found["config"].is_string()) return false;
  auto config = ParseConfig(found["config"].get<std::string>(), "compare.json");
  if (!config.ok()) return false;
  found["config"] = ToToml(*config);
  return found == want;
}

// Across the first sweep's numeric key: each method's gap to the baseline run of the same setting
// (of the keys that can change the baseline), against the value or, for train.steps, the tokens
// per parameter. The other sweeps' keys name a series each with the method (e.g. "diloco,
// optim.name=muon"). Nothing when there is no baseline or a value is not a number.
struct GapTrend {
  std::string x_label;
  std::vector<GapSeries> series;
};

std::optional<GapTrend> GapsAcross(const std::vector<Sweep>& sweeps,
                                   const std::vector<MethodResult>& runs, const Config& config) {
  const std::string& x_key = sweeps.front().key;
  // A run's setting ("k1=v1 k2=v2") as its pairs.
  auto pairs = [](const std::string& setting) {
    std::vector<std::pair<std::string, std::string>> out;
    for (absl::string_view part : absl::StrSplit(setting, ' ', absl::SkipEmpty())) {
      const size_t eq = part.find('=');
      if (eq != absl::string_view::npos) out.emplace_back(part.substr(0, eq), part.substr(eq + 1));
    }
    return out;
  };
  auto baseline_setting = [&](const std::string& setting) {
    std::vector<std::string> kept;
    for (const auto& [key, value] : pairs(setting)) {
      if (ChangesBaseline(key)) kept.push_back(absl::StrCat(key, "=", value));
    }
    return absl::StrJoin(kept, " ");
  };
  std::map<std::string, double> baseline;  // setting -> val_loss
  for (const auto& r : runs) {
    if (r.method == "baseline") baseline[r.setting] = r.val_loss;
  }
  const bool per_parameter = x_key == "train.steps";
  const double params = double(inner::ParameterCount(config.model));
  GapTrend trend;
  trend.x_label = per_parameter ? "tokens per parameter" : x_key;
  for (const auto& r : runs) {
    if (r.method == "baseline") continue;
    auto base = baseline.find(baseline_setting(r.setting));
    if (base == baseline.end()) return std::nullopt;
    double x = double(r.tokens) / params;
    std::string name = r.method;
    for (const auto& [key, value] : pairs(r.setting)) {
      if (key != x_key) {
        absl::StrAppend(&name, ", ", key, "=", value);
      } else if (!per_parameter && !absl::SimpleAtod(value, &x)) {
        return std::nullopt;
      }
    }
    auto series = std::find_if(trend.series.begin(), trend.series.end(),
                               [&](const GapSeries& g) { return g.method == name; });
    if (series == trend.series.end()) series = trend.series.insert(trend.series.end(), {name, {}});
    series->points.emplace_back(x, 100.0 * (r.val_loss / base->second - 1.0));
  }
  if (trend.series.empty()) return std::nullopt;
  for (auto& g : trend.series) std::sort(g.points.begin(), g.points.end());
  return trend;
}

std::string GapTable(const GapTrend& trend) {
  std::string out = absl::StrCat("\n## Gap to the baseline by ", trend.x_label, "\n\n| method | ",
                                 trend.x_label, " | val_loss vs baseline |\n| --- | ---: | ---: |\n");
  for (const auto& g : trend.series) {
    for (auto [x, gap] : g.points) absl::StrAppend(&out, absl::StrFormat("| %s | %.4g | %+.2f%% |\n", g.method, x, gap));
  }
  return out;
}

}  // namespace

// report.md (printed too), report.csv, loss.svg and, for sweeps, gap.svg (against the first key).
absl::Status WriteReports(const CompareOptions& o, const Config& config,
                          const std::vector<Sweep>& sweeps, const std::vector<MethodResult>& runs,
                          const std::vector<MethodResult>& best) {
  std::string title =
      absl::StrFormat("atoll compare: %d islands, %d inner steps, H = %d (%s)", o.islands,
                      config.train.steps, config.outer.sync_every, o.config_path);
  if (!sweeps.empty()) absl::StrAppend(&title, ", each method at its best setting");
  std::string report = ReportMarkdown(best, title, runs);
  std::vector<std::pair<std::string, std::string>> files = {
      {"report.csv", ReportCsv(runs)},
      {"loss.svg", LossPlotSvg(best, title)},
      {"pareto.svg", ParetoPlotSvg(runs, title + ": loss against WAN bytes")}};
  if (!sweeps.empty()) {
    if (auto trend = GapsAcross(sweeps, runs, config)) {
      report += GapTable(*trend);
      files.emplace_back("gap.svg", GapPlotSvg(trend->series, trend->x_label,
                                               absl::StrFormat("%s: gap to the baseline by %s",
                                                               o.config_path, trend->x_label)));
    }
  }
  files.emplace_back("report.md", report);
  std::vector<std::string> written;
  for (const auto& [name, text] : files) {
    ATL_RETURN_IF_ERROR(WriteFileAtomic((fs::path(o.run_dir) / name).string(), text));
    written.push_back(name);
  }
  std::printf("%s", report.c_str());
  std::printf("\nwrote %s/%s\n", o.run_dir.c_str(), absl::StrJoin(written, ", ").c_str());
  return absl::OkStatus();
}

// Every run's whole config (each method at each grid point), checked before the first one starts;
// what a method changes because a key of the config cannot apply to it is said here.
absl::Status CheckRuns(const CompareOptions& o, const std::vector<Override>& overrides,
                       const std::vector<Method>& methods, const std::vector<Sweep>& sweeps,
                       const Config& config) {
  for (const auto& m : methods) {
    std::set<std::string> said;
    for (const auto& point : GridFor(m, sweeps)) {
      auto with = overrides;
      with.insert(with.end(), point.begin(), point.end());
      // The method's changes of this point's config, as DiLoCo() makes them.
      ATL_ASSIGN_OR_RETURN(const Config at_point,
                           LoadConfig(o.config_path, with, ConfigChecks::kKeys));
      const MethodChanges changes = ChangesOf(m, at_point);
      const std::string notes = absl::StrJoin(changes.notes, ", ");
      if (!notes.empty() && said.insert(notes).second) {
        std::fprintf(stderr, "atoll compare: %s%s runs with %s\n", m.name.c_str(),
                     point.empty() ? "" : absl::StrCat(" at ", SettingOf(point)).c_str(),
                     notes.c_str());
      }
      with.insert(with.end(), changes.overrides.begin(), changes.overrides.end());
      if (auto checked = LoadConfig(o.config_path, with); !checked.ok()) {
        return absl::Status(checked.status().code(),
                            absl::StrCat("compare: ", m.name, point.empty() ? "" : " at ",
                                         SettingOf(point), ": ", checked.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// One run of the plan: a method at a grid point.
struct PlannedRun {
  Method method;
  std::vector<Override> point;
  std::optional<MethodResult> done;  // finished before: reused
};

// The runs, and their cost said before anything runs.
std::vector<PlannedRun> PlanRuns(const CompareOptions& o, const Config& config,
                                 const std::vector<Method>& methods,
                                 const std::vector<Sweep>& sweeps) {
  std::vector<PlannedRun> plan;
  std::vector<std::string> counts;
  int reused = 0;
  int64_t island_steps = 0;  // the cost: each run's inner steps x its islands
  for (const auto& m : methods) {
    const auto grid = GridFor(m, sweeps);
    counts.push_back(absl::StrCat(m.name, " x ", grid.size()));
    for (const auto& point : grid) {
      plan.push_back({m, point, LoadResult(RunDirOf(o.run_dir, m.name, SettingOf(point)))});
      reused += plan.back().done.has_value();
      int64_t steps = config.train.steps, islands = o.islands;
      for (const auto& [key, value] : point) {
        if (key == "train.steps") (void)absl::SimpleAtoi(value, &steps);
        if (key == "outer.islands") (void)absl::SimpleAtoi(value, &islands);
      }
      island_steps += steps * islands;
    }
  }
  std::fprintf(
      stderr,
      "atoll compare: %s = %zu runs of %lld inner steps on %d islands (%lld island-steps); "
      "%d finished runs reused\n",
      absl::StrJoin(counts, ", ").c_str(), plan.size(), (long long)config.train.steps, o.islands,
      (long long)island_steps, reused);
  return plan;
}

// A directory holding this same compare resumes; anything else is refused.
absl::Status OpenRunDir(const CompareOptions& o, const Config& config,
                        const std::vector<Sweep>& sweeps) {
  const fs::path dir(o.run_dir);
  const auto manifest = Manifest(config, o, sweeps);
  const std::string manifest_path = (dir / "compare.json").string();
  if (fs::exists(dir) && !fs::is_empty(dir)) {
    std::ifstream in(manifest_path);
    if (!SameCompare(nlohmann::json::parse(in, nullptr, false), manifest)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "run directory ", o.run_dir,
          " is not empty and holds another compare (config, islands or sweeps differ)"));
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  return WriteFileAtomic(manifest_path, manifest.dump(2) + "\n");
}

// A run not finished before, started afresh.
absl::StatusOr<MethodResult> RunOne(const CompareOptions& o, const std::vector<Override>& overrides,
                                    const PlannedRun& run) {
  const std::string setting = SettingOf(run.point);
  const std::string run_dir = RunDirOf(o.run_dir, run.method.name, setting);
  std::error_code ec;
  fs::remove_all(run_dir, ec);  // a run stopped half-way starts again
  auto with = overrides;
  with.insert(with.end(), run.point.begin(), run.point.end());
  // The method makes its changes to this template (CheckRuns checked the result whole).
  ATL_ASSIGN_OR_RETURN(auto c, LoadConfig(o.config_path, with, ConfigChecks::kKeys));
  ATL_ASSIGN_OR_RETURN(auto r, run.method.kind == MethodKind::kBaseline
                                   ? Baseline(c, o, run_dir)
                                   : DiLoCo(c, o, run.method, run.point, run_dir));
  r.setting = setting;
  ATL_RETURN_IF_ERROR(SaveResult(run_dir, r));
  return r;
}

}  // namespace

absl::StatusOr<std::vector<MethodResult>> RunCompare(const CompareOptions& o) {
  if (o.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is required");
  if (o.islands < 1) return absl::InvalidArgumentError("--islands must be >= 1");
  ATL_ASSIGN_OR_RETURN(auto overrides, ParseOverrides(o.overrides));
  overrides.emplace_back("outer.islands", std::to_string(o.islands));
  // The template of the runs: its keys fit together once a method has made its changes (a sparse
  // method turns error feedback on, say), which CheckRuns checks for every run.
  ATL_ASSIGN_OR_RETURN(auto config, LoadConfig(o.config_path, overrides, ConfigChecks::kKeys));
  // Check the data before starting anything.
  ATL_RETURN_IF_ERROR(text::LoadDataset(config.data, config.model));
  ATL_ASSIGN_OR_RETURN(auto sweeps, ParseSweeps(o, overrides));
  ATL_ASSIGN_OR_RETURN(auto methods, ParseMethods(config.compare.methods));
  ATL_RETURN_IF_ERROR(CheckRuns(o, overrides, methods, sweeps, config));
  if (o.dry_run) {  // the plan and its cost, then stop
    PlanRuns(o, config, methods, sweeps);
    std::fprintf(stderr, "atoll compare: every run's config is valid (dry run: nothing started)\n");
    return std::vector<MethodResult>();
  }
  ATL_RETURN_IF_ERROR(OpenRunDir(o, config, sweeps));
  std::vector<MethodResult> runs;
  for (auto& run : PlanRuns(o, config, methods, sweeps)) {
    if (run.done) {
      runs.push_back(*std::move(run.done));
      continue;
    }
    ATL_ASSIGN_OR_RETURN(auto r, RunOne(o, overrides, run));
    runs.push_back(std::move(r));
  }
  const auto best = BestPerMethod(runs);
  ATL_RETURN_IF_ERROR(WriteReports(o, config, sweeps, runs, best));
  return best;
}

}  // namespace atl
