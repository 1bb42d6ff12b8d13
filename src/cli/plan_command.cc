#include "src/cli/plan_command.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "compression/status_macros.h"
#include "inner/model.h"
#include "outer/base/fragments.h"

namespace atl {
namespace {

using outer::PlanInput;
using outer::PlanMethod;

struct Row {
  std::string label;
  PlanInput in;
};

// What the rows are made of: the model's parameters by fragment placement, and the settings.
struct Setting {
  std::optional<inner::ModelConfig> model;  // exact fragment sizes when known
  int64_t params = 0;
  outer::FragmentPattern pattern = outer::FragmentPattern::kStrided;
  int islands = 2, sync_every = 100, fragments = 8, tau = 1, connections = 1;
  int service_threads = 1, shards = 1;  // the service as configured (commits)
  std::string codec;
  double topk_density = 1;  // the config's sparse pseudo-gradients (1: dense)
  int topk_chunk = 4096;
  bool linear_step = true;  // the config's outer step is linear (sgd, or no momentum)
  outer::SyncPhases phases;  // the config's warm start and early H (a run of --steps)
};

// SparseLoCo's settings for the ladder's sparse row when the config has none: 1% of each chunk of
// 4096 kept, values in int2.
constexpr double kLadderDensity = 0.01;
// Sparse rounds reach DiLoCo's quality only at a shorter H: on `tiny`, sparse 3% int2 trails
// DiLoCo fp32 at H = 50 by 8.7% (by 4.8% keeping 10%) and by 0.97% at H = 25 (mean of 3 seeds;
// compression/README.md), so the ladder also plans the sparse row at H / 2.
constexpr int kSparseHDivisor = 2;

// Elements per fragment: by the model's fragment groups (inner::FragmentGroups) when it is known,
// else an even split.
absl::StatusOr<std::vector<uint64_t>> FragmentSizes(const Setting& s, int fragments) {
  std::vector<uint64_t> sizes(size_t(fragments), 0);
  if (!s.model) {
    for (int f = 0; f < fragments; ++f) {
      sizes[size_t(f)] = uint64_t(s.params / fragments + (f < s.params % fragments ? 1 : 0));
    }
    return sizes;
  }
  const auto shapes = inner::ParameterShapes(*s.model);
  std::vector<std::string> names;
  for (const auto& [name, shape] : shapes) names.push_back(name);
  ATL_ASSIGN_OR_RETURN(auto plan, outer::PlanFragments(
                                      inner::FragmentGroups(inner::PlanOf(*s.model), names),
                                      fragments, s.pattern));
  for (size_t i = 0; i < shapes.size(); ++i) {
    uint64_t numel = 1;
    for (int64_t d : shapes[i].second) numel *= uint64_t(d);
    sizes[plan.fragment_of[i]] += numel;
  }
  return sizes;
}

// `density` < 1: sparse pseudo-gradients, that share of each chunk of `chunk` kept; `h` > 0:
// rounds every h steps instead of the setting's H.
absl::StatusOr<Row> MakeRow(const Setting& s, const PlanInput& base, PlanMethod method,
                            int fragments, int tau, std::string codec_name, double density = 1,
                            int chunk = 4096, int h = 0) {
  Row row;
  row.in = base;
  row.in.method = method;
  if (h > 0) row.in.sync_every = h;
  row.in.tau = method == PlanMethod::kStreaming ? tau : 0;
  ATL_ASSIGN_OR_RETURN(auto codec, compression::ParseCodec(codec_name));
  if (density < 1) {
    const uint32_t kept = uint32_t(std::max(1.0, std::round(density * chunk)));
    ATL_ASSIGN_OR_RETURN(codec, compression::MakeSpec(int(codec.codec), uint32_t(chunk), kept));
    codec_name = absl::StrFormat("top %g%% of %d, %s", 100 * density, chunk, codec_name);
  }
  row.in.codec = codec;
  ATL_ASSIGN_OR_RETURN(auto sizes,
                       FragmentSizes(s, method == PlanMethod::kStreaming ? fragments : 1));
  row.in.fragment_elements = sizes;
  ATL_RETURN_IF_ERROR(outer::ValidatePlanInput(row.in));
  switch (method) {
    case PlanMethod::kDataParallel:
      row.label = absl::StrFormat("data parallel, %s gradients every step", codec_name);
      break;
    case PlanMethod::kDiLoCo:
      row.label = absl::StrFormat("DiLoCo, H = %d, %s", row.in.sync_every, codec_name);
      break;
    case PlanMethod::kStreaming:
      row.label = absl::StrFormat("Streaming, H = %d, P = %d, tau = %d, %s", row.in.sync_every,
                                  fragments, tau, codec_name);
      break;
  }
  return row;
}

// Without --method, the ladder of the Streaming DiLoCo paper's Table 4: data parallel, DiLoCo,
// Streaming, with overlap, with overlap and a low-bit codec (16-bit payloads otherwise); then
// with sparse 2-bit pseudo-gradients.
absl::StatusOr<std::vector<Row>> MakeRows(const Setting& s, const PlanInput& base,
                                          const std::string& method) {
  std::vector<absl::StatusOr<Row>> rows;
  if (!method.empty()) {
    ATL_ASSIGN_OR_RETURN(auto m, outer::ParsePlanMethod(method));
    rows.push_back(MakeRow(s, base, m, s.fragments, s.tau, s.codec.empty() ? "fp32" : s.codec,
                           s.topk_density, s.topk_chunk));
  } else {
    rows.push_back(MakeRow(s, base, PlanMethod::kDataParallel, 1, 0, "bf16"));
    rows.push_back(MakeRow(s, base, PlanMethod::kDiLoCo, 1, 0, "bf16"));
    rows.push_back(MakeRow(s, base, PlanMethod::kStreaming, s.fragments, 0, "bf16"));
    rows.push_back(MakeRow(s, base, PlanMethod::kStreaming, s.fragments, s.tau, "bf16"));
    const bool sparse = s.topk_density < 1;
    rows.push_back(MakeRow(s, base, PlanMethod::kStreaming, s.fragments, s.tau,
                           s.codec.empty() || s.codec == "fp32" || sparse ? "fp4_e2m1" : s.codec));
    // Beyond the paper: sparse 2-bit pseudo-gradients (SparseLoCo), the config's or 1% of 4096.
    const std::string codec = sparse ? s.codec : "int2";
    const double density = sparse ? s.topk_density : kLadderDensity;
    const int chunk = sparse ? s.topk_chunk : 4096;
    rows.push_back(MakeRow(s, base, PlanMethod::kStreaming, s.fragments, s.tau, codec, density,
                           chunk));
    // The same at the H its quality needs, when that H is a valid setting (fragments, tau and the
    // early phases fit in it: MakeRow validates).
    if (const int h = s.sync_every / kSparseHDivisor; h >= 1) {
      auto row = MakeRow(s, base, PlanMethod::kStreaming, s.fragments, s.tau, codec, density,
                         chunk, h);
      if (row.ok()) {
        row->label += absl::StrFormat(" (H / %d, where sparse came within 1%% of DiLoCo's val_loss on tiny)",
                                      kSparseHDivisor);
        rows.push_back(std::move(row));
      }
    }
  }
  std::vector<Row> out;
  for (auto& r : rows) {
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

// The model and settings: the config's (when given), then the flags.
absl::StatusOr<Setting> ResolveSetting(const PlanOptions& o) {
  Setting s;
  std::optional<Config> config;
  if (!o.config_path.empty() || !o.overrides.empty()) {
    ATL_ASSIGN_OR_RETURN(auto c, LoadConfig(o.config_path, o.overrides));
    config = c;
    s.islands = c.outer.islands;
    s.sync_every = c.outer.sync_every;
    s.fragments = c.outer.num_fragments;
    s.tau = c.outer.fragment_sync_delay;
    s.codec = compression::CodecName(c.outer.codec.codec);
    s.topk_density = c.outer.topk_density;
    s.topk_chunk = c.outer.topk_chunk;
    s.connections = c.outer.connections;
    s.phases = c.outer.phases;
    s.pattern = c.outer.fragment_pattern;
    s.service_threads = std::max(1, c.outer.service_threads);  // auto (0): planned as 1
    s.shards = c.outer.shards;
    s.linear_step = outer::TraitsOf(c.outer.optimizer).linear(c.outer.optimizer);
  }
  if (o.params > 0) {
    s.params = o.params;
  } else if (config) {
    s.model = config->model;
    s.params = inner::ParameterCount(config->model);
  } else {
    return absl::InvalidArgumentError("give the model: --params N (e.g. 1e9, 1.5B) or --config");
  }
  if (o.islands > 0) s.islands = o.islands;
  if (o.sync_every > 0) s.sync_every = o.sync_every;
  if (o.fragments > 0) s.fragments = o.fragments;
  if (o.tau >= 0) s.tau = o.tau;
  if (!o.codec.empty()) s.codec = o.codec;
  if (o.service_threads != 0) s.service_threads = o.service_threads;  // the planner refuses < 1
  if (o.shards != 0) s.shards = o.shards;
  if (o.connections != 0) s.connections = o.connections;  // the planner refuses < 1
  return s;
}

absl::StatusOr<PlanInput> BaseInput(const PlanOptions& o, const Setting& s) {
  PlanInput in;
  if (!(o.step_time_s > 0)) {
    return absl::InvalidArgumentError("give the inner step time: --step-time SECONDS (e.g. 0.1)");
  }
  in.step_time_s = o.step_time_s;
  in.islands = s.islands;
  in.sync_every = s.sync_every;
  in.steps = o.steps;
  in.phases = s.phases;
  in.commit_s_per_param = o.commit_ns_per_param * 1e-9;
  in.service_threads = s.service_threads;
  in.shards = s.shards;
  in.linear_outer_step = s.linear_step;
  in.commit_parallel_fraction = o.commit_parallel_fraction;
  if (!o.service_bandwidth.empty()) {
    ATL_ASSIGN_OR_RETURN(auto bw, outer::ParseBandwidth(o.service_bandwidth));
    in.service_bandwidth_bps = bw;
  }
  ATL_ASSIGN_OR_RETURN(auto topology, outer::ParsePlanTopology(o.topology));
  in.topology = topology;
  ATL_ASSIGN_OR_RETURN(auto latency, outer::ParseDuration(o.latency));
  in.link.latency_s = latency;
  in.link.connections = s.connections;
  in.link.tcp_window_bytes = o.tcp_window_mib * (1 << 20);
  if (!o.bandwidth.empty()) {
    ATL_ASSIGN_OR_RETURN(auto bw, outer::ParseBandwidth(o.bandwidth));
    in.link.bandwidth_bps = bw;
  } else if (!(o.target > 0)) {
    return absl::InvalidArgumentError(
        "give --bandwidth (e.g. 1gbit), --target-utilization (e.g. 0.95), or both");
  }
  return in;
}

struct RowResult {
  outer::PlanResult at_link;                  // valid when a bandwidth was given
  absl::StatusOr<double> required = 0.0;      // when a target was given
};

void PrintHeader(const PlanOptions& o, const Setting& s, const PlanInput& base) {
  const double per_connection =
      base.link.latency_s > 0 ? 8.0 * base.link.tcp_window_bytes / (2 * base.link.latency_s) : 0;
  absl::FPrintF(
      o.out,
      "atoll plan: %.4gM parameters (%s in fp32), %.3f s per inner step, %d islands; link %s each "
      "way, latency %.0f ms, %d TCP connection(s)%s; %s; %s; %s\n",
      double(s.params) / 1e6, outer::FormatBytes(4.0 * double(s.params)), base.step_time_s,
      base.islands, o.bandwidth.empty() ? "swept" : outer::FormatBandwidth(base.link.bandwidth_bps),
      1e3 * base.link.latency_s, base.link.connections,
      per_connection > 0 ? absl::StrCat(" (", outer::FormatBandwidth(per_connection), " each)") : "",
      base.topology == outer::PlanTopology::kStar
          ? "star: each island pushes to the service and receives the update"
          : "ring: all-reduce between islands from the backward pass on (the paper's model)",
      base.steps > 0 ? absl::StrCat("a run of ", base.steps, " steps, ending synced")
                     : "steady state",
      base.topology == outer::PlanTopology::kStar
          ? absl::StrFormat("the service commits in %.2f ns per parameter per island on one "
                            "thread (sparse rounds with a linear step: %.0f ns per value kept; "
                            "measured by atoll loadtest), on %d service thread(s) "
                            "(parallel fraction %.2f) and %d shard(s)",
                            1e9 * base.commit_s_per_param, 1e9 * base.sparse_commit_s_per_value,
                            base.service_threads, base.commit_parallel_fraction, base.shards)
          : "no service");
}

void PrintTable(const PlanOptions& o, const std::vector<Row>& rows,
                const std::vector<RowResult>& results) {
  const bool util = !o.bandwidth.empty(), need = o.target > 0;
  absl::FPrintF(o.out, "| method | sent per island per round | per island per hour | peak in flight |%s%s\n",
                util ? " utilization |" : "",
                need ? absl::StrFormat(" needs for %.0f%% |", 100 * o.target) : "");
  absl::FPrintF(o.out, "| --- | ---: | ---: | ---: |%s%s\n", util ? " ---: |" : "",
                need ? " ---: |" : "");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = results[i];
    std::string needs;
    if (need) {
      needs = r.required.ok() ? absl::StrCat(" ", outer::FormatBandwidth(*r.required), " |")
                              : " unreachable |";
    }
    absl::FPrintF(o.out, "| %s | %s | %s | %s |%s%s\n", rows[i].label,
                  outer::FormatBytes(r.at_link.bytes_sent_per_round),
                  outer::FormatBytes(r.at_link.bytes_per_hour / 2),
                  rows[i].in.method == PlanMethod::kDataParallel
                      ? std::string("-")
                      : outer::FormatBytes(double(r.at_link.peak_bytes_in_flight)),
                  util ? absl::StrFormat(" %.1f%% |", 100 * r.at_link.utilization) : "", needs);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (need && !results[i].required.ok()) {
      absl::FPrintF(o.out, "%s: %s\n", rows[i].label, results[i].required.status().message());
    }
  }
}

void PrintJson(const PlanOptions& o, const std::vector<Row>& rows,
               const std::vector<RowResult>& results) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = results[i].at_link;
    nlohmann::json j = {{"method", outer::PlanMethodName(rows[i].in.method)},
                        {"label", rows[i].label},
                        {"fragments", rows[i].in.fragment_elements.size()},
                        {"tau", rows[i].in.tau},
                        {"bytes_sent_per_round", r.bytes_sent_per_round},
                        {"bytes_received_per_round", r.bytes_received_per_round},
                        {"bytes_per_hour", r.bytes_per_hour},
                        {"peak_bytes_in_flight", r.peak_bytes_in_flight}};
    if (!o.bandwidth.empty()) {
      j["utilization"] = r.utilization;
      j["wall_s"] = r.wall_s;
      j["compute_s"] = r.compute_s;
    }
    if (o.target > 0 && results[i].required.ok()) j["required_bps"] = *results[i].required;
    absl::FPrintF(o.out, "%s\n", j.dump());
  }
}

// Utilization against bandwidth (log scale, 1 Mbit/s to 1 Tbit/s), one line per row.
absl::Status WriteSvg(const std::string& path, const std::vector<Row>& rows, double target) {
  constexpr double kW = 760, kH = 420, kLeft = 60, kRight = 250, kTop = 20, kBottom = 50;
  constexpr double kLo = 6, kHi = 12;  // log10 bits/s
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  auto x = [&](double lg) { return kLeft + (lg - kLo) / (kHi - kLo) * (kW - kLeft - kRight); };
  auto y = [&](double u) { return kTop + (1 - u) * (kH - kTop - kBottom); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n",
      kW, kH);
  for (int d = int(kLo); d <= int(kHi); ++d) {
    const char* names[] = {"1 Mbit/s", "10 Mbit/s", "100 Mbit/s", "1 Gbit/s", "10 Gbit/s",
                           "100 Gbit/s", "1 Tbit/s"};
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          x(d), y(1), x(d), y(0), x(d), y(0) + 16, names[d - int(kLo)]);
  }
  for (int p = 0; p <= 100; p += 25) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                          x(kLo), y(p / 100.0), x(kHi), y(p / 100.0), x(kLo) - 4,
                          y(p / 100.0) + 4, p);
  }
  if (target > 0) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" "
                          "stroke-dasharray=\"4 3\"/>\n",
                          x(kLo), y(target), x(kHi), y(target));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">bandwidth per island, "
                        "each way</text>\n<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 "
                        "%.1f)\" text-anchor=\"middle\">compute utilization</text>\n",
                        x((kLo + kHi) / 2), kH - 8, y(0.5), y(0.5));
  for (size_t i = 0; i < rows.size(); ++i) {
    PlanInput in = rows[i].in;
    std::string points;
    for (int k = 0; k <= 96; ++k) {
      const double lg = kLo + (kHi - kLo) * k / 96;
      in.link.bandwidth_bps = std::pow(10.0, lg);
      absl::StrAppendFormat(&points, "%.1f,%.1f ", x(lg), y(outer::Simulate(in).utilization));
    }
    const char* color = colors[i % 6];
    absl::StrAppendFormat(&svg,
                          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                          "points=\"%s\"/>\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "stroke=\"%s\" stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\" "
                          "font-size=\"11\">%s</text>\n",
                          color, points, kW - kRight + 10, kTop + 10 + 18 * i, kW - kRight + 30,
                          kTop + 10 + 18 * i, color, kW - kRight + 34, kTop + 14 + 18 * i,
                          rows[i].label);
  }
  svg += "</svg>\n";
  std::ofstream f(path);
  f << svg;
  f.close();
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPlan(const PlanOptions& o) {
  if (o.target != 0 && !(o.target > 0 && o.target < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target-utilization must be in (0, 1), got ", o.target));
  }
  ATL_ASSIGN_OR_RETURN(auto setting, ResolveSetting(o));
  ATL_ASSIGN_OR_RETURN(auto base, BaseInput(o, setting));
  ATL_ASSIGN_OR_RETURN(auto rows, MakeRows(setting, base, o.method));
  std::vector<RowResult> results(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    results[i].at_link = outer::Simulate((rows)[i].in);
    if (o.target > 0) results[i].required = outer::RequiredBandwidth((rows)[i].in, o.target);
    if (o.bandwidth.empty() && results[i].required.ok()) {
      // No link given: the traffic per hour at the bandwidth the target needs.
      outer::PlanInput at_target = (rows)[i].in;
      at_target.link.bandwidth_bps = *results[i].required;
      results[i].at_link = outer::Simulate(at_target);
    }
  }
  if (o.json) {
    PrintJson(o, rows, results);
  } else {
    PrintHeader(o, setting, base);
    PrintTable(o, rows, results);
  }
  if (!o.svg.empty()) {
    ATL_RETURN_IF_ERROR(WriteSvg(o.svg, rows, o.target));
    if (!o.json) absl::FPrintF(o.out, "utilization vs bandwidth: %s\n", o.svg);
  }
  return absl::OkStatus();
}

}  // namespace atl
