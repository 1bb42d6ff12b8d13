#include "src/cli/results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compression/status_macros.h"
#include "src/store/atomic_file.h"

namespace atl {

namespace fs = std::filesystem;

namespace {
constexpr char kResultFile[] = "result.json";

}  // namespace

absl::Status SaveResult(const std::string& dir, const MethodResult& r) {
  nlohmann::json j = {{"method", r.method}, {"setting", r.setting}, {"val_loss", r.val_loss},
                      {"val_bpb", std::isnan(r.val_bpb) ? nlohmann::json() : nlohmann::json(r.val_bpb)},
                      {"tokens", r.tokens}, {"wan_bytes", r.wan_bytes},
                      {"bytes_up", r.bytes_up}, {"bytes_down", r.bytes_down},
                      {"bits_up", std::isnan(r.bits_up) ? nlohmann::json() : nlohmann::json(r.bits_up)},
                      {"bits_down", std::isnan(r.bits_down) ? nlohmann::json() : nlohmann::json(r.bits_down)},
                      {"wall_s", r.wall_s},
                      {"note", r.note}, {"curve", r.curve}};
  return WriteFileAtomic((fs::path(dir) / kResultFile).string(), j.dump() + "\n");
}

std::optional<MethodResult> LoadResult(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kResultFile);
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (!in || j.is_discarded()) return std::nullopt;
  try {
    MethodResult r;
    r.method = j.at("method");
    r.setting = j.at("setting");
    r.val_loss = j.at("val_loss").is_number() ? j["val_loss"].get<double>() : NAN;
    r.val_bpb = j.contains("val_bpb") && j["val_bpb"].is_number() ? j["val_bpb"].get<double>() : NAN;
    r.tokens = j.at("tokens");
    r.wan_bytes = j.at("wan_bytes");
    r.bytes_up = j.value("bytes_up", uint64_t(0));
    r.bytes_down = j.value("bytes_down", uint64_t(0));
    r.bits_up = j.contains("bits_up") && j["bits_up"].is_number() ? j["bits_up"].get<double>() : NAN;
    r.bits_down = j.contains("bits_down") && j["bits_down"].is_number() ? j["bits_down"].get<double>() : NAN;
    r.wall_s = j.at("wall_s");
    r.note = j.at("note");
    r.curve = j.at("curve").get<std::vector<std::pair<double, double>>>();
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // run again
  }
}


namespace {

struct Row {
  std::string label;
  std::vector<std::string> dirs;
};

absl::StatusOr<Row> ParseRow(const std::string& text) {
  const auto eq = text.find('=');
  Row row;
  if (eq != std::string::npos) {
    row.label = text.substr(0, eq);
    row.dirs = absl::StrSplit(text.substr(eq + 1), ',', absl::SkipEmpty());
  }
  if (eq == std::string::npos || row.label.empty() || row.dirs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not LABEL=DIR[,DIR...] (e.g. \"DiLoCo fp32=runs/dl-s0,runs/dl-s1\")"));
  }
  return row;
}

// Every result under `dir` (the directory itself or any below it), in path order.
std::vector<MethodResult> ResultsUnder(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kResultFile, ec)) found.push_back(dir);
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().filename() == kResultFile) {
      found.push_back(it->path().parent_path().string());
    }
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  std::vector<MethodResult> out;
  for (const auto& d : found) {
    if (auto r = LoadResult(d)) {
      r->setting = d;
      out.push_back(*std::move(r));
    }
  }
  return out;
}

std::string Mib(double bytes) { return absl::StrFormat("%.2f MiB", bytes / double(1 << 20)); }

// A row a label: the mean of its runs, their spread, against the first row's mean.
std::string Summary(const std::vector<Row>& rows, const std::vector<MethodResult>& runs,
                    const std::string& title) {
  std::string md = absl::StrCat("# ", title, "\n\n",
                                "| row | runs | mean val_loss | min / max | vs first | WAN up / "
                                "down (mean) | bits/param up / down |\n",
                                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double first = NAN;
  for (const auto& row : rows) {
    double loss = 0, lo = INFINITY, hi = -INFINITY, up = 0, down = 0, bits_up = 0, bits_down = 0;
    int n = 0;
    for (const auto& r : runs) {
      if (r.method != row.label) continue;
      loss += r.val_loss;
      lo = std::min(lo, r.val_loss);
      hi = std::max(hi, r.val_loss);
      up += double(r.bytes_up);
      down += double(r.bytes_down);
      bits_up += r.bits_up;
      bits_down += r.bits_down;
      ++n;
    }
    loss /= n;
    if (std::isnan(first)) first = loss;
    md += absl::StrFormat("| %s | %d | %.4f | %.4f / %.4f | %+.2f%% | %s / %s | %.3f / %.3f |\n",
                          row.label, n, loss, lo, hi, 100.0 * (loss / first - 1), Mib(up / n),
                          Mib(down / n), bits_up / n, bits_down / n);
  }
  md += "\n| row | run | val_loss | WAN up / down |\n| --- | --- | ---: | ---: |\n";
  for (const auto& r : runs) {
    md += absl::StrFormat("| %s | %s | %.4f | %s / %s |\n", r.method, r.setting, r.val_loss,
                          Mib(double(r.bytes_up)), Mib(double(r.bytes_down)));
  }
  return md;
}

}  // namespace

absl::StatusOr<std::vector<MethodResult>> RunReport(const ReportOptions& o) {
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.rows.empty()) return absl::InvalidArgumentError("give the rows: LABEL=DIR[,DIR...] ...");
  std::vector<Row> rows;
  std::vector<MethodResult> runs;
  std::set<std::string> labels;
  for (const auto& text : o.rows) {
    ATL_ASSIGN_OR_RETURN(Row row, ParseRow(text));
    if (!labels.insert(row.label).second) {
      return absl::InvalidArgumentError(absl::StrCat("row '", row.label, "' is given twice"));
    }
    for (const auto& dir : row.dirs) {
      auto found = ResultsUnder(dir);
      if (found.empty()) {
        return absl::NotFoundError(absl::StrCat("row '", row.label, "': no ", kResultFile,
                                                " under '", dir, "'"));
      }
      for (auto& r : found) {
        r.method = row.label;
        runs.push_back(std::move(r));
      }
    }
    rows.push_back(std::move(row));
  }
  const std::string title = o.title.empty() ? "atoll report" : o.title;
  const std::string md = Summary(rows, runs, title);
  std::error_code ec;
  fs::create_directories(o.out, ec);
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"report.md", md},
           {"report.csv", ReportCsv(runs)},
           {"pareto.svg", ParetoPlotSvg(runs, title + ": loss against WAN bytes")}}) {
    ATL_RETURN_IF_ERROR(WriteFileAtomic((fs::path(o.out) / name).string(), text));
  }
  std::printf("%s\nwrote %s/report.md, report.csv, pareto.svg\n", md.c_str(), o.out.c_str());
  return runs;
}

}  // namespace atl
