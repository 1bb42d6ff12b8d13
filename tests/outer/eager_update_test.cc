// Eager updates (outer/island/eager_update.h): the stand-in and the swap, to the float.
#include "outer/island/eager_update.h"

#include <gtest/gtest.h>

#include <vector>

namespace atl::outer {
namespace {

TEST(EagerUpdateTest, TheGainIsTheOuterStepPerUnitOfTheAverage) {
  OuterOptimizerConfig c;  // Nesterov, lr 0.7, momentum 0.9
  EXPECT_DOUBLE_EQ(EagerGain(c), 0.7 * 1.9);
  c.nesterov = false;  // heavy ball: u = lr (mu m + g)
  EXPECT_DOUBLE_EQ(EagerGain(c), 0.7);
  c.name = "sgd";
  c.lr = 2;
  EXPECT_DOUBLE_EQ(EagerGain(c), 2.0);
}

// Two rounds by hand: the first stand-in is the island's own share of the step, the second the
// last update with that share refreshed; each landing keeps the steps trained since the push.
TEST(EagerUpdateTest, StandInsAreTheLastUpdateWithTheIslandsShareRefreshed) {
  EagerUpdate eager(/*gain=*/2.0, /*islands=*/2);
  const std::vector<float> global = {1.0f, -2.0f, 0.5f};
  const std::vector<float> local = {0.5f, -1.0f, 0.5f};  // delta = (0.5, -1, 0)
  // u_hat = 0 + (2 / 2) x (delta - 0) = delta.
  EXPECT_EQ(eager.StandIn(global, local), (std::vector<float>{0.5f, -1.0f, 0.5f}));
  EXPECT_TRUE(eager.in_flight());
  // The round commits u = (0.25, -0.5, 0.125) from 4 contributors; the island trained +0.125 on
  // every parameter meanwhile.
  const std::vector<float> global1 = {0.75f, -1.5f, 0.375f};
  std::vector<float> trained = {0.625f, -0.875f, 0.625f};
  eager.Land(global1, 4, trained);
  EXPECT_EQ(trained, (std::vector<float>{0.875f, -1.375f, 0.5f}));  // global1 + 0.125
  EXPECT_FALSE(eager.in_flight());
  // Next round: delta = global1 - local2 = (0.5, 0.5, 0.5); u_hat = u_prev + (2 / 4) x
  // (delta - delta_prev) = (0.25, -0.5, 0.125) + 0.5 x (0, 1.5, 0.5) = (0.25, 0.25, 0.375).
  const std::vector<float> local2 = {0.25f, -2.0f, -0.125f};
  EXPECT_EQ(eager.StandIn(global1, local2), (std::vector<float>{0.5f, -1.75f, 0.0f}));
  // Forgotten (the island reloads the global parameters): the next stand-in starts afresh.
  eager.Forget();
  EXPECT_FALSE(eager.in_flight());
  // u_hat = 0 + (2 / 4) x delta, delta = (0.5, 0.5, 0.5): the stand-in is global1 - 0.25.
  EXPECT_EQ(eager.StandIn(global1, local2), (std::vector<float>{0.5f, -1.75f, 0.125f}));
}

// One island, outer SGD of lr 1: the service's update is the island's pseudo-gradient, so the
// stand-in is the island's own parameters and the landing keeps everything it trained.
TEST(EagerUpdateTest, OneIslandWithUnitSgdTrainsOnAsIfAlone) {
  EagerUpdate eager(1.0, 1);
  std::vector<float> global = {1.0f, 2.0f}, local = {0.5f, 2.5f};
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(eager.StandIn(global, local), local) << round;
    std::vector<float> next_global = local;  // theta - (theta - local), exact for these values
    std::vector<float> trained = {local[0] - 0.25f, local[1] + 0.25f};
    const std::vector<float> expected = trained;
    eager.Land(next_global, 1, trained);
    EXPECT_EQ(trained, expected) << round;
    global = next_global;
    local = {trained[0] - 0.25f, trained[1] + 0.5f};
  }
}

}  // namespace
}  // namespace atl::outer
