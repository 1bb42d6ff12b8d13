// A run's result (RUN_DIR/result.json, what `atoll compare` keeps of each finished run), and
// `atoll report`: runs of several compares (or of other seeds) gathered into one report.
//
//   atoll report --out DIR LABEL=DIR[,DIR...] ...
//
// Each LABEL names a row: every result.json under its directories is one of its runs (seeds, say).
// report.md has each row's mean validation loss over its runs with their spread, against the first
// row's mean, its mean WAN bytes each way and bits per parameter, then every run; pareto.svg puts
// every run at its loss against its WAN bytes (a series per row); report.csv lists the runs.
#ifndef ATOLL_SRC_CLI_RESULTS_H_
#define ATOLL_SRC_CLI_RESULTS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/cli/report.h"

namespace atl {

absl::Status SaveResult(const std::string& dir, const MethodResult& result);
// The result kept in `dir`; none when it has none or it cannot be read (the run is done again).
std::optional<MethodResult> LoadResult(const std::string& dir);

struct ReportOptions {
  std::string out;                  // directory for report.md, report.csv, pareto.svg
  std::vector<std::string> rows;    // "LABEL=DIR[,DIR...]"
  std::string title;                // of the report and the plot ("" : a default)
};

// The rows' runs, a row after the other (each run's method is its row's label, its setting the
// directory it was found in). NOT_FOUND naming a directory without any result, INVALID_ARGUMENT
// for a row that is not LABEL=DIR[,DIR...] or a label given twice; nothing is written then.
absl::StatusOr<std::vector<MethodResult>> RunReport(const ReportOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_RESULTS_H_
