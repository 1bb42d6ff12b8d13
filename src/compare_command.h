// `atoll compare`: methods at equal compute (isoflops) on the same data and seed.
//   baseline: one island, global batch M x b (b x grad_accum M), T steps
//   diloco:   M islands through a real coordinator, batch b each, T inner steps, outer round every H
// Writes report.md, report.csv and loss.svg into the run directory and prints the table.
#ifndef ATOLL_SRC_COMPARE_COMMAND_H_
#define ATOLL_SRC_COMPARE_COMMAND_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/report.h"

namespace atl {

struct CompareOptions {
  int islands = 2;
  std::string config_path;
  std::vector<std::string> overrides;  // "--key=value"
  std::vector<double> throttle;        // per island, for every multi-island row
  std::string run_dir;
  const std::atomic<bool>* stop = nullptr;
};

absl::StatusOr<std::vector<MethodResult>> RunCompare(const CompareOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_COMPARE_COMMAND_H_
