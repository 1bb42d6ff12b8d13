// The grace window's rule (outer/base/grace.h): parsing, the bootstrap, median + 3 MAD of the
// recent arrival spreads relative to the round period, its floors.
#include <gtest/gtest.h>

#include "outer/base/grace.h"

namespace atl::outer {
namespace {

TEST(GraceTest, ParsesAdaptiveOffAndSeconds) {
  GraceSpec g;
  ASSERT_TRUE(ParseConfigValue("off", &g).ok());
  EXPECT_EQ(g.mode, GraceSpec::Mode::kOff);
  ASSERT_TRUE(ParseConfigValue("2.5", &g).ok());
  EXPECT_EQ(g.mode, GraceSpec::Mode::kSeconds);
  EXPECT_EQ(g.seconds, 2.5);
  EXPECT_EQ(ConfigValueText(g), "2.5");
  ASSERT_TRUE(ParseConfigValue("adaptive", &g).ok());
  EXPECT_EQ(ConfigValueText(g), "adaptive");
  for (const char* bad : {"-1", "soon", "", "nan", "inf"}) {
    const absl::Status s = ParseConfigValue(bad, &g);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("\"adaptive\", \"off\" or seconds"), std::string::npos) << bad;
  }
  EXPECT_EQ(ConfigValueText(g), "adaptive");  // a refusal changes nothing
}

TEST(GraceTest, AdaptiveWaitsForTheDeadlineThenFollowsTheSpreads) {
  const GraceSpec adaptive;
  ArrivalHistory h;
  EXPECT_FALSE(h.Window(adaptive, 0).has_value());   // no period: the first round
  EXPECT_FALSE(h.Window(adaptive, 10).has_value());  // no history: the fixed deadline
  // Spreads of 1, 2 and 3 s over rounds of 10 s: ratios 0.1, 0.2, 0.3; median 0.2, MAD 0.1.
  h.Add(1, 10);
  h.Add(2, 10);
  EXPECT_FALSE(h.Window(adaptive, 10).has_value());  // fewer than kGraceMinRounds
  h.Add(3, 10);
  ASSERT_TRUE(h.Window(adaptive, 10).has_value());
  EXPECT_DOUBLE_EQ(*h.Window(adaptive, 10), (0.2 + 3 * 0.1 + 0.25) * 10);
  // Spreads of 0.2, 0.4, 0.6 s: median 0.04, MAD 0.02 of the period.
  ArrivalHistory tight;
  for (double spread : {0.2, 0.4, 0.6}) tight.Add(spread, 10);
  EXPECT_NEAR(*tight.Window(adaptive, 10), (0.04 + 3 * 0.02 + 0.25) * 10, 1e-12);
  // Relative to the period: a round twice as long gets twice the window.
  EXPECT_NEAR(*tight.Window(adaptive, 20), (0.04 + 3 * 0.02 + 0.25) * 20, 1e-12);
  EXPECT_FALSE(h.Window(adaptive, 0).has_value());  // no period known
  // Identical spreads (MAD 0): the quarter period on top; never below the floor.
  ArrivalHistory same;
  for (int i = 0; i < 5; ++i) same.Add(1, 10);
  EXPECT_DOUBLE_EQ(*same.Window(adaptive, 10), 3.5);
  EXPECT_DOUBLE_EQ(*same.Window(adaptive, 1), kGraceFloorSeconds);
  EXPECT_DOUBLE_EQ(*same.Window(adaptive, 1, 0.1), 0.35);
  same.Clear();  // a new phase of the schedule
  EXPECT_FALSE(same.Window(adaptive, 10).has_value());
}

TEST(GraceTest, OffAndFixedIgnoreTheHistory) {
  ArrivalHistory h;
  EXPECT_FALSE(h.Window({GraceSpec::Mode::kOff, 0}, 10).has_value());
  EXPECT_DOUBLE_EQ(*h.Window({GraceSpec::Mode::kSeconds, 1.5}, 10), 1.5);
  for (int i = 0; i < 5; ++i) h.Add(1, 10);
  EXPECT_FALSE(h.Window({GraceSpec::Mode::kOff, 0}, 10).has_value());
}

TEST(GraceTest, KeepsTheRecentRoundsOnlyAndRefusesNonsense) {
  ArrivalHistory h;
  for (size_t i = 0; i < kGraceHistory; ++i) h.Add(9, 10);  // old: slow
  for (size_t i = 0; i < kGraceHistory; ++i) h.Add(1, 10);  // recent: fast
  EXPECT_EQ(h.size(), kGraceHistory);
  EXPECT_DOUBLE_EQ(*h.Window({}, 10), 3.5);
  h.Add(-1, 10);
  h.Add(1, 0);
  h.Add(1, -5);
  EXPECT_EQ(h.size(), kGraceHistory);
}

}  // namespace
}  // namespace atl::outer
