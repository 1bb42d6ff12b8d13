// Comparison reports: a Markdown table, a CSV and an SVG plot of validation loss against tokens.
#ifndef ATOLL_SRC_REPORT_H_
#define ATOLL_SRC_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace atl {

struct MethodResult {
  std::string method;
  double val_loss = 0;
  int64_t tokens = 0;
  uint64_t wan_bytes = 0;
  double wall_s = 0;
  std::string note;                               // how wan_bytes was obtained, etc.
  std::vector<std::pair<double, double>> curve;  // (tokens, val_loss)
};

std::string ReportCsv(const std::vector<MethodResult>& results);
std::string ReportMarkdown(const std::vector<MethodResult>& results, const std::string& title);
std::string LossPlotSvg(const std::vector<MethodResult>& results, const std::string& title);

}  // namespace atl

#endif  // ATOLL_SRC_REPORT_H_
