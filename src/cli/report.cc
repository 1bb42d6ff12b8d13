#include "src/cli/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace atl {
namespace {

std::string HumanBytes(uint64_t b) {
  if (b >= (1ULL << 30)) return absl::StrFormat("%.2f GiB", double(b) / double(1ULL << 30));
  if (b >= (1ULL << 20)) return absl::StrFormat("%.1f MiB", double(b) / double(1ULL << 20));
  return absl::StrFormat("%.1f KiB", double(b) / 1024.0);
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string Label(const MethodResult& r) {
  return r.setting.empty() ? r.method : absl::StrCat(r.method, " (", r.setting, ")");
}

std::vector<MethodResult> BestPerMethod(const std::vector<MethodResult>& runs) {
  std::vector<MethodResult> best;
  for (const auto& r : runs) {
    auto it = std::find_if(best.begin(), best.end(),
                           [&](const MethodResult& b) { return b.method == r.method; });
    if (it == best.end()) {
      best.push_back(r);
    } else if (std::isnan(it->val_loss) || r.val_loss < it->val_loss) {
      *it = r;
    }
  }
  return best;
}

std::string ReportCsv(const std::vector<MethodResult>& runs) {
  const auto best = BestPerMethod(runs);
  std::string out =
      "method,setting,val_loss,val_bpb,tokens,wan_bytes,bytes_up,bytes_down,bits_up,bits_down,"
      "wall_s,best\n";
  for (const auto& r : runs) {
    const bool is_best = std::any_of(best.begin(), best.end(), [&](const MethodResult& b) {
      return b.method == r.method && b.setting == r.setting;
    });
    // Not measured (the baseline's bits per parameter, bits per byte of token shards): empty.
    const auto field = [](double v, const char* format) {
      return std::isfinite(v) && v >= 0 ? absl::StrFormat(format, v) : std::string();
    };
    absl::StrAppend(&out, absl::StrFormat("%s,%s,%.6f,%s,%d,%d,%d,%d,%s,%s,%.2f,%d\n", r.method,
                                          r.setting, r.val_loss, field(r.val_bpb, "%.6f"), r.tokens,
                                          r.wan_bytes, r.bytes_up, r.bytes_down,
                                          field(r.bits_up, "%.4f"), field(r.bits_down, "%.4f"),
                                          r.wall_s, is_best));
  }
  return out;
}

namespace {

void AppendTable(const std::vector<MethodResult>& results, std::string* out) {
  const double base = results.empty() ? 0 : results.front().val_loss;
  *out += "| method | val_loss | bits/byte | vs first | tokens | WAN bytes | up / down | "
          "bits/param up / down | wall |\n";
  *out += "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& r : results) {
    const std::string bpb = std::isnan(r.val_bpb) ? "-" : absl::StrFormat("%.4f", r.val_bpb);
    const std::string ways = r.bytes_up + r.bytes_down == 0
                                 ? "-"
                                 : absl::StrCat(HumanBytes(r.bytes_up), " / ", HumanBytes(r.bytes_down));
    const std::string bits = std::isnan(r.bits_up)
                                 ? "-"
                                 : absl::StrFormat("%.3f / %.3f", r.bits_up, r.bits_down);
    absl::StrAppend(out, absl::StrFormat("| %s | %.4f | %s | %+.2f%% | %d | %s | %s | %s | %.1f s |\n",
                                         Label(r), r.val_loss, bpb,
                                         100.0 * (r.val_loss / base - 1.0), r.tokens,
                                         HumanBytes(r.wan_bytes), ways, bits, r.wall_s));
  }
}

}  // namespace

std::string ReportMarkdown(const std::vector<MethodResult>& results, const std::string& title,
                           const std::vector<MethodResult>& grid) {
  std::string out = absl::StrCat("# ", title, "\n\n");
  AppendTable(results, &out);
  out += "\n";
  for (const auto& r : results) {
    if (!r.note.empty()) absl::StrAppend(&out, "- ", Label(r), ": ", r.note, "\n");
  }
  if (grid.size() > results.size()) {
    absl::StrAppend(&out, "\n## Every run of the sweep (", grid.size(), " runs; vs the first)\n\n");
    AppendTable(grid, &out);
  }
  return out;
}

namespace {

// A line plot: one polyline (and, with `markers`, a dot per point) per series, a legend, five
// ticks per axis; x from 0 (or from the smallest x) to the largest, y over the data and `y_also`.
struct Plot {
  std::string title, x_label, y_label;
  double x_unit = 1;        // x ticks show x / x_unit (3 significant digits) ...
  std::string x_suffix;     // ... and this
  bool x_from_zero = true;
  bool markers = false;
  std::vector<double> y_also;   // values the y range must include (a reference line)
  std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> series;
};

std::string LinePlotSvg(const Plot& plot) {
  const double w = 720, h = 440, left = 70, right = 180, top = 40, bottom = 50;
  double x_min = plot.x_from_zero ? 0 : INFINITY, x_max = -INFINITY;
  double y_min = INFINITY, y_max = -INFINITY;
  for (double y : plot.y_also) {
    y_min = std::min(y_min, y);
    y_max = std::max(y_max, y);
  }
  for (const auto& [label, points] : plot.series) {
    for (auto [x, y] : points) {
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_min = std::min(y_min, y);
      y_max = std::max(y_max, y);
    }
  }
  if (!(y_max > y_min)) {
    y_min -= 0.5;
    y_max += 0.5;
  }
  if (!(x_max > x_min)) x_max = x_min + 1;
  const double pad = 0.05 * (y_max - y_min);
  y_min -= pad;
  y_max += pad;
  auto px = [&](double x) { return left + (x - x_min) / (x_max - x_min) * (w - left - right); };
  auto py = [&](double y) { return top + (y_max - y) / (y_max - y_min) * (h - top - bottom); };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"%.0f\" y=\"22\" font-size=\"15\">%s</text>\n",
      w, h, left, Escape(plot.title));
  // Axes, ticks and grid.
  absl::StrAppend(&svg, absl::StrFormat(
                            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
                            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                            left, h - bottom, w - right, h - bottom, left, top, left, h - bottom));
  for (int i = 0; i <= 5; ++i) {
    const double x = x_min + (x_max - x_min) * i / 5, y = y_min + (y_max - y_min) * i / 5;
    const std::string x_text = absl::StrFormat("%.3g", x / plot.x_unit) + plot.x_suffix;
    absl::StrAppend(&svg, absl::StrFormat(
                              "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
                              "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                              "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n",
                              px(x), h - bottom + 18, Escape(x_text), left, py(y), w - right, py(y),
                              left - 6, py(y) + 4, y));
  }
  for (double y : plot.y_also) {
    absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                          "stroke=\"black\" stroke-dasharray=\"4 3\"/>\n",
                                          left, py(y), w - right, py(y)));
  }
  absl::StrAppend(&svg, absl::StrFormat(
                            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
                            "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" "
                            "text-anchor=\"middle\">%s</text>\n",
                            (left + w - right) / 2, h - 12, Escape(plot.x_label),
                            (top + h - bottom) / 2, (top + h - bottom) / 2, Escape(plot.y_label)));
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const char* color = kColors[i % 6];
    const auto& [label, points] = plot.series[i];
    std::string line;
    for (auto [x, y] : points) {
      absl::StrAppend(&line, absl::StrFormat("%.1f,%.1f ", px(x), py(y)));
      if (plot.markers) {
        absl::StrAppend(&svg, absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                                              px(x), py(y), color));
      }
    }
    absl::StrAppend(&svg, absl::StrFormat(
                              "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n"
                              "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                              "stroke-width=\"3\"/>\n<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                              color, line, w - right + 12, top + 10 + 20.0 * i, w - right + 36,
                              top + 10 + 20.0 * i, color, w - right + 42, top + 14 + 20.0 * i,
                              Escape(label)));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::string LossPlotSvg(const std::vector<MethodResult>& results, const std::string& title) {
  Plot plot;
  plot.title = title;
  plot.x_label = "tokens (all islands)";
  plot.y_label = "validation loss (nats/token)";
  plot.x_unit = 1e6;
  plot.x_suffix = "M";
  for (const auto& r : results) plot.series.emplace_back(Label(r), r.curve);
  return LinePlotSvg(plot);
}

std::string ParetoPlotSvg(const std::vector<MethodResult>& runs, const std::string& title) {
  Plot plot;
  plot.title = title;
  plot.x_label = "WAN bytes of the run, sent + received (log10)";
  plot.y_label = "validation loss (nats/token)";
  plot.x_from_zero = false;
  plot.markers = true;
  std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> series;
  for (const auto& r : runs) {
    if (r.wan_bytes == 0 || std::isnan(r.val_loss)) continue;
    auto it = std::find_if(series.begin(), series.end(),
                           [&](const auto& s) { return s.first == r.method; });
    if (it == series.end()) it = series.insert(series.end(), {r.method, {}});
    it->second.emplace_back(std::log10(double(r.wan_bytes)), r.val_loss);
  }
  for (auto& [method, points] : series) {
    std::sort(points.begin(), points.end());
    plot.series.emplace_back(method, points);
  }
  return LinePlotSvg(plot);
}

std::string GapPlotSvg(const std::vector<GapSeries>& series, const std::string& x_label,
                       const std::string& title) {
  Plot plot;
  plot.title = title;
  plot.x_label = x_label;
  plot.y_label = "validation loss vs the baseline (%)";
  plot.x_from_zero = false;
  plot.markers = true;
  plot.y_also = {0.0};  // the baseline
  for (const auto& s : series) plot.series.emplace_back(s.method, s.points);
  return LinePlotSvg(plot);
}

}  // namespace atl
