#include "inner/loss_guard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace atl::inner {
namespace {

using ::testing::HasSubstr;

TEST(LossSpikeGuardTest, FlagsNonFiniteAndSpikesButNotNoiseOrTrend) {
  LossSpikeGuard guard(20, 6.0);
  EXPECT_THAT(*guard.Check(std::nan("")), HasSubstr("non-finite"));
  EXPECT_THAT(*guard.Check(std::numeric_limits<double>::infinity()), HasSubstr("non-finite"));
  // A falling, noisy loss is never flagged.
  for (int i = 0; i < 200; ++i) {
    const double loss = 3.0 - 0.005 * i + 0.02 * std::sin(i * 1.7);
    ASSERT_FALSE(guard.Check(loss).has_value()) << i;
  }
  // The window holds 2.1 ... 2.0 with noise (median about 2.05, robust sigma about 0.04): 2.6 is far
  // out, 2.15 is not.
  const auto spike = guard.Check(2.6);
  ASSERT_TRUE(spike.has_value());
  EXPECT_THAT(*spike, HasSubstr("is a spike"));
  EXPECT_FALSE(guard.Check(2.15).has_value());
  // Spikes stay out of the window: a run of them does not become the new normal.
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(guard.Check(5.0).has_value());
}

TEST(LossSpikeGuardTest, JudgesOnlyOnceHalfTheWindowIsFullAndWindowZeroOnlyChecksFiniteness) {
  LossSpikeGuard guard(10, 3.0);
  for (double loss : {5.0, 1.0, 9.0, 1.0}) EXPECT_FALSE(guard.Check(loss).has_value());
  LossSpikeGuard off(0, 3.0);
  EXPECT_FALSE(off.Check(1e9).has_value());
  EXPECT_TRUE(off.Check(std::nan("")).has_value());
}

}  // namespace
}  // namespace atl::inner
