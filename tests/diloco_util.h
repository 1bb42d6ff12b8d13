// What the tests of the outer loop around the real trainer share (diloco_test.cc, streaming_test.cc):
// the small config they start from, one island against a fresh in-process service, and the
// plainly trained reference with the comparison that holds a run to it.
#ifndef ATOLL_TESTS_DILOCO_UTIL_H_
#define ATOLL_TESTS_DILOCO_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "src/config/config.h"
#include "src/island/island_loop.h"

namespace atl {
namespace inner {
class Trainer;
}

// testing::TinyConfig on `text_path`: 20 steps, no evaluation, one island.
Config DiLoCoConfig(const std::string& text_path);

// One island ("solo", its files under run_dir) against a fresh in-process service of `c`: what
// the island reported and the service's parameters at the end.
struct SoloRun {
  absl::StatusOr<IslandSummary> summary;
  std::vector<float> params;
};
SoloRun RunSolo(const Config& c, const std::string& run_dir);

// A model trained plainly for `steps` steps on the config's data (the reference of the tests that
// expect an outer loop to change nothing).
std::unique_ptr<inner::Trainer> TrainPlainly(const Config& c, int steps);

// The service's parameters against a plainly trained model, each tensor to a relative 1e-5.
void ExpectPlainTraining(const Config& c, const std::vector<float>& global, inner::Trainer& plain);

}  // namespace atl

#endif  // ATOLL_TESTS_DILOCO_UTIL_H_
