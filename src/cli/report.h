// Comparison reports: a Markdown table, a CSV, an SVG plot of validation loss against tokens and,
// across a sweep, one of each method's gap to the baseline against the swept value.
#ifndef ATOLL_SRC_CLI_REPORT_H_
#define ATOLL_SRC_CLI_REPORT_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace atl {

struct MethodResult {
  std::string method;
  std::string setting;  // the sweep's values for this run ("optim.lr=0.002 outer.lr=0.7"), or ""
  double val_loss = 0;
  double val_bpb = NAN;  // bits per byte of text: compares tokenizers fairly (NAN: unknown)
  int64_t tokens = 0;
  uint64_t wan_bytes = 0;
  // Each way (islands' pushes; updates and state fetches), and per parameter and round
  // (NAN: not measured, e.g. the baseline).
  uint64_t bytes_up = 0, bytes_down = 0;
  double bits_up = NAN, bits_down = NAN;
  double wall_s = 0;
  std::string note;                               // how wan_bytes was obtained, etc.
  std::vector<std::pair<double, double>> curve;  // (tokens, val_loss)
};

// "diloco" or "diloco (optim.lr=0.002)".
std::string Label(const MethodResult& result);
// Each method's run with the lowest validation loss, in the order methods first appear.
std::vector<MethodResult> BestPerMethod(const std::vector<MethodResult>& runs);

// Every run, a row each; `best` is 1 on each method's best run.
std::string ReportCsv(const std::vector<MethodResult>& runs);
// The table of `results` (against the first row); with `grid` larger than `results` (a sweep),
// every run of the grid follows in a second table.
std::string ReportMarkdown(const std::vector<MethodResult>& results, const std::string& title,
                          const std::vector<MethodResult>& grid = {});
std::string LossPlotSvg(const std::vector<MethodResult>& results, const std::string& title);
// Validation loss against WAN bytes (log scale), every run a dot, a line per method through its
// runs in order of bytes: where each method trades bytes for loss (the Pareto front).
std::string ParetoPlotSvg(const std::vector<MethodResult>& runs, const std::string& title);

// A method's gap to the baseline across a sweep: (x, 100 x (val_loss / baseline's - 1)).
struct GapSeries {
  std::string method;
  std::vector<std::pair<double, double>> points;
};
// The gaps against x (one line and a dot per point per method; the baseline dashed at 0).
std::string GapPlotSvg(const std::vector<GapSeries>& series, const std::string& x_label,
                       const std::string& title);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_REPORT_H_
