// `atoll compare`: methods at equal compute (isoflops) on the same data and seed.
//   baseline: one island, global batch M x b (b x grad_accum M), T steps
//   diloco:   M islands through a real coordinator, batch b each, T inner steps, outer round every H
// With --sweep KEY=V1,V2 (repeatable) each method runs every combination of the values (the
// baseline only those of keys that can change it: not outer.*, except outer.islands, M) and is
// reported at its best: best-vs-best at equal compute. Every finished run keeps its result
// (RUN_DIR/<method>/<setting>/result.json): the same command again resumes where it stopped and
// reuses them. Writes report.md, report.csv (every run) and loss.svg into the run directory and
// prints the table; a sweep of one numeric key adds each method's gap to the baseline against it
// (a table in report.md and gap.svg).
#ifndef ATOLL_SRC_CLI_COMPARE_COMMAND_H_
#define ATOLL_SRC_CLI_COMPARE_COMMAND_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/cli/report.h"

namespace atl {

struct CompareOptions {
  int islands = 2;
  std::string config_path;
  std::vector<std::string> overrides;  // "--key=value"
  std::vector<double> throttle;        // per island, for every multi-island row
  // "key=v1,v2,...": every method runs the grid of these (best-vs-best); its best run is its row.
  std::vector<std::string> sweeps;
  std::string run_dir;
  const std::atomic<bool>* stop = nullptr;
  bool dry_run = false;  // check every run's config, say what each method changes, run nothing
};

// Each method's best run, in compare.methods order (none for a dry run). Every run's whole config
// is checked before the first one starts.
absl::StatusOr<std::vector<MethodResult>> RunCompare(const CompareOptions& options);

}  // namespace atl

#endif  // ATOLL_SRC_CLI_COMPARE_COMMAND_H_
