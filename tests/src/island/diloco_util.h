// What the tests of the outer loop around the real trainer share (diloco_test.cc, streaming_test.cc,
// device_copy_test.cc): the small configs they start from, islands against an in-process service,
// and the plainly trained reference with the comparison that holds a run to it.
#ifndef ATOLL_TESTS_SRC_ISLAND_DILOCO_UTIL_H_
#define ATOLL_TESTS_SRC_ISLAND_DILOCO_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "outer/service/sync_server.h"
#include "src/config/config.h"
#include "src/island/island_loop.h"
#include "tests/test_util.h"

namespace atl {
namespace inner {
class Trainer;
}

// testing::TinyConfig on `text_path`: 20 steps, no evaluation, one island.
Config DiLoCoConfig(const std::string& text_path);

// 2 islands of a 4-layer model with 4 fragments, tau = 2, FP4, on generated text in `dir`.
Config StreamingConfig(const testing::TempDir& dir);

// Runs every island of `c` in its own thread against one in-process service (island i throttled
// to throttle[i] steps per second where given, every call `call_delay` late).
std::vector<absl::StatusOr<IslandSummary>> RunIslands(const Config& c, outer::SyncServer& server,
                                                      const testing::TempDir& dir,
                                                      std::vector<double> throttle = {},
                                                      absl::Duration call_delay = {});

// XXH64 of the service's fragments, concatenated (what islands report as global_hash).
uint64_t ServiceHash(const outer::SyncServer& server);

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

#endif  // ATOLL_TESTS_SRC_ISLAND_DILOCO_UTIL_H_
