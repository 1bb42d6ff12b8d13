// Reputation from loss-probe scores (outer/base/scoring.h): a harmful island is left out of the
// rounds it harms, then excluded by its reputation within a few rounds, readmitted once its
// contributions help again, and the round never falls below its quorum; honest islands, noisy as
// they are, keep their full weight.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "outer/base/scoring.h"

namespace atl::outer {
namespace {

constexpr size_t kRows = 32;

// What a contribution buys on each of the probe's rows: `gain` on average, with noise of `sd`
// per row (drawn from `seed`).
std::vector<double> Rows(double gain, double sd, uint64_t seed, size_t rows = kRows) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, sd);
  std::vector<double> d(rows);
  for (double& x : d) x = gain + noise(rng);
  return d;
}

using Rows_ = std::map<std::string, std::vector<double>>;

ScoreReport Round(Reputation& r, const Rows_& gains, size_t quorum = 1,
                  const Rows_& combined = {}) {
  ScoreReport report;
  r.Judge(gains, combined, quorum, &report);
  return report;
}

const ScoringOptions kOptions{true, 0.8, 0.5, 0.2, 5, 4};

TEST(ReputationTest, AHarmfulIslandIsExcludedAndHonestOnesKeepTheirWeight) {
  Reputation r(kOptions);
  int excluded_at = -1;
  for (int round = 0; round < 10; ++round) {
    // Honest islands buy 0.010 each, their rows noisy; mallory's contribution hurts, 3x as much.
    const uint64_t s = uint64_t(round) * 8;
    const auto report = Round(r, {{"a", Rows(0.010, 0.005, s)}, {"b", Rows(0.010, 0.005, s + 1)},
                                  {"c", Rows(0.010, 0.005, s + 2)},
                                  {"mallory", Rows(-0.030, 0.005, s + 3)}});
    EXPECT_GE(report.median_t, 4) << "round " << round;  // the round judges
    for (const char* honest : {"a", "b", "c"}) {
      EXPECT_EQ(report.islands.at(honest).score, 1.0) << honest << " round " << round;
      EXPECT_EQ(report.islands.at(honest).weight, 1.0) << honest << " round " << round;
      EXPECT_FALSE(report.islands.at(honest).excluded);
    }
    const IslandScore& m = report.islands.at("mallory");
    EXPECT_LT(m.t, -12);
    EXPECT_EQ(m.score, -1.0);
    // Harmful beyond doubt: left out of every round it lands in, from the first, while its
    // reputation falls 1 -> 0.6 -> 0.28 -> 0.024 (below 0.2: excluded by it from its third round).
    EXPECT_TRUE(m.harmful) << "round " << round;
    EXPECT_TRUE(m.excluded);
    EXPECT_EQ(m.weight, 0);
    if (round == 0) EXPECT_NEAR(m.reputation, 0.6, 1e-12);
    if (r.Standing("mallory").excluded && excluded_at < 0) excluded_at = round;
  }
  EXPECT_EQ(excluded_at, 2);
}

// A contribution clearly worse than the median but not beyond doubt (-12 < t < -4, a fifth of the
// median's gain) is scored and down-weighted only through its reputation: it stays in its round.
TEST(ReputationTest, AWeakContributionStaysInItsRoundAtItsReputationsWeight) {
  Reputation r(kOptions);
  const auto report = Round(r, {{"a", Rows(0.010, 0.0005, 1)}, {"b", Rows(0.010, 0.0005, 2)},
                                {"c", Rows(0.010, 0.0005, 3)}, {"w", Rows(0.002, 0.008, 4)}});
  const IslandScore& w = report.islands.at("w");
  ASSERT_LT(w.t, -4);
  ASSERT_GT(w.t, -12);
  EXPECT_LT(w.score, 0.5);
  EXPECT_FALSE(w.harmful);
  EXPECT_FALSE(w.excluded);
  EXPECT_EQ(w.weight, 1.0);  // reputation 0.8 + 0.2 x score, above the floor
}

// Honest islands whose rows are as noisy as what they buy: the rounds judge (the median helps
// measurably), and the noise alone lowers no weight over 300 rounds.
TEST(ReputationTest, NoiseAloneLowersNoHonestWeight) {
  Reputation r(kOptions);
  int judged = 0;
  for (int round = 0; round < 300; ++round) {
    std::map<std::string, std::vector<double>> gains;
    for (int i = 0; i < 4; ++i) {
      gains["island" + std::to_string(i)] = Rows(0.01, 0.01, uint64_t(round) * 4 + uint64_t(i));
    }
    const auto report = Round(r, gains);
    judged += report.median_t >= 4;
    for (const auto& [id, s] : report.islands) {
      ASSERT_EQ(s.weight, 1.0) << id << " round " << round << " t " << s.t;
    }
  }
  EXPECT_GT(judged, 250);
}

// Late in a run the median buys nothing measurable: the round judges nobody, so a contribution
// of zeros is neither lowered nor readmitted then, while a round that judges scores it 0.
TEST(ReputationTest, OnlyARoundWhoseMedianHelpsJudges) {
  Reputation r(kOptions);
  const std::vector<double> zeros(kRows, 0.0);
  auto late = Round(r, {{"a", Rows(0.0005, 0.02, 1)}, {"b", Rows(0.0005, 0.02, 2)},
                        {"z", zeros}});
  EXPECT_LT(late.median_t, 4);
  EXPECT_EQ(late.islands.at("z").reputation, 1.0);
  auto early = Round(r, {{"a", Rows(0.01, 0.002, 3)}, {"b", Rows(0.01, 0.002, 4)}, {"z", zeros}});
  EXPECT_GE(early.median_t, 4);
  EXPECT_EQ(early.islands.at("z").score, 0.0);
  EXPECT_NEAR(early.islands.at("z").reputation, 0.8, 1e-12);
  EXPECT_EQ(early.islands.at("a").score, 1.0);
}

// Leave-one-out: an island whose contribution alone buys what the others' do (a model trained on
// shuffled tokens learns the byte frequencies as they do), while the round's average does better
// without it beyond doubt, is left out from its third round; two such rounds are not enough.
TEST(ReputationTest, AnIslandThatPullsTheAverageApartIsLeftOutFromItsThirdRound) {
  Reputation r(kOptions);
  for (uint64_t round = 0; round < 6; ++round) {
    uint64_t s = round * 8;
    Rows_ gains, combined;
    for (const char* id : {"a", "b", "c", "g"}) {
      gains[id] = Rows(0.5, 0.05, s++);
      // Honest: the average loses a little without each (t about 3); without g it gains (t -11).
      combined[id] = Rows(id[0] == 'g' ? -0.002 : 0.0005, 0.001, s++);
    }
    const auto report = Round(r, gains, 1, combined);
    ASSERT_GE(report.median_t, 4);
    const IslandScore& g = report.islands.at("g");
    EXPECT_GT(g.t, -4) << "round " << round;  // alone, as good as the others
    EXPECT_LT(g.loo_t, -8) << "round " << round;
    EXPECT_NEAR(g.loo_evidence, -8 * (1 - std::pow(0.8, double(round + 1))), 1e-9);
    EXPECT_EQ(g.excluded, round >= 2) << "round " << round;
    EXPECT_EQ(g.harmful, round >= 2);
    EXPECT_EQ(g.pulls_apart, round >= 2);
    EXPECT_EQ(g.score, round >= 2 ? 0.0 : 1.0);
    for (const char* honest : {"a", "b", "c"}) {
      EXPECT_FALSE(report.islands.at(honest).excluded) << honest << " round " << round;
      EXPECT_EQ(report.islands.at(honest).weight, 1.0);
    }
  }
}

// The leave-one-out t of honest islands measured on micro (4 islands; dense runs of 150 and 300
// rounds, a sparse one of 300): mean +0.3 to +1.8, standard deviation 1.7 to 2.7, single rounds
// down to -24. Over 300 rounds drawn like the sparse run's (mean 0.45, spread 2.5, plus the rows'
// own noise), no honest island is left out although single rounds reach -8, nor by one round of
// -100 (drawn so, about one 300-round run in 70 leaves an honest island out at threshold 3).
TEST(ReputationTest, HonestLeaveOneOutNoiseLeavesNobodyOut) {
  Reputation r(kOptions);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> round_t(0.45, 2.5);
  double lowest = 0;
  for (int round = 0; round < 301; ++round) {
    Rows_ gains, combined;
    for (int i = 0; i < 4; ++i) {
      const std::string id = "island" + std::to_string(i);
      gains[id] = Rows(0.01, 0.005, uint64_t(round) * 8 + uint64_t(i));
      // Rows whose t over the 32 rows is about the round's draw (one round of -100 at the end).
      const double t = round == 300 && i == 0 ? -100 : round_t(rng);
      combined[id] = Rows(t * 0.001 / std::sqrt(double(kRows)), 0.001, uint64_t(round) * 8 + 4 +
                                                                          uint64_t(i));
    }
    const auto report = Round(r, gains, 1, combined);
    for (const auto& [id, s] : report.islands) {
      lowest = std::min(lowest, s.loo_t);
      ASSERT_FALSE(s.excluded) << id << " round " << round << " evidence " << s.loo_evidence;
    }
  }
  EXPECT_LT(lowest, -8);
}

// A probe of 128 rows (micro at batch 64) measures an honest island's small, steady pull (its own
// data stream: t about -5 over 128 rows in every round, evidence that would reach -5) as finely
// as it measures a shuffled island's: its t's are read as a 32-row probe's (about -2.5), so it
// stays in over 50 rounds, while the one that pulls apart is still left out from its third round.
TEST(ReputationTest, ALargerProbeReadsItsTsAsThirtyTwoRowsDo) {
  constexpr size_t kLarge = 128;
  Reputation r(kOptions);
  const double honest_pull = -5 * 0.001 / std::sqrt(double(kLarge));
  for (uint64_t round = 0; round < 50; ++round) {
    uint64_t s = round * 8;
    Rows_ gains, combined;
    for (const char* id : {"a", "b", "c", "g"}) {
      gains[id] = Rows(0.5, 0.05, s++, kLarge);
      combined[id] = Rows(id[0] == 'g' ? -0.004 : id[0] == 'a' ? honest_pull : 0.0005, 0.001, s++,
                          kLarge);
    }
    const auto report = Round(r, gains, 1, combined);
    const IslandScore& a = report.islands.at("a");
    EXPECT_GT(a.loo_t, -4.5) << "round " << round;  // about -2.5, not -5
    EXPECT_LT(a.loo_t, -0.5) << "round " << round;
    EXPECT_FALSE(a.excluded) << "round " << round << " evidence " << a.loo_evidence;
    EXPECT_EQ(report.islands.at("g").excluded, round >= 2) << "round " << round;
  }
}

TEST(ReputationTest, AnExcludedIslandIsReadmittedOnceItHelpsAgainAfterItsTimeOut) {
  Reputation r(kOptions);
  for (uint64_t round = 0; round < 3; ++round) {
    Round(r, {{"a", Rows(0.01, 0.002, 3 * round)}, {"b", Rows(0.01, 0.002, 3 * round + 1)},
              {"m", Rows(-0.01, 0.002, 3 * round + 2)}});
  }
  ASSERT_TRUE(r.Standing("m").excluded);
  int readmitted = -1;
  for (uint64_t round = 0; round < 12 && readmitted < 0; ++round) {
    const auto report = Round(r, {{"a", Rows(0.01, 0.002, 100 + 3 * round)},
                                  {"b", Rows(0.01, 0.002, 101 + 3 * round)},
                                  {"m", Rows(0.01, 0.002, 102 + 3 * round)}});
    if (!report.islands.at("m").excluded) readmitted = int(round);
  }
  // Excluded at its 3rd round for 5 of its rounds: out until its 8th, when its reputation
  // (0.024 -> 0.219 -> 0.375 -> 0.500 -> 0.600 -> 0.680) is back above the floor.
  EXPECT_EQ(readmitted, 4);
  EXPECT_GE(r.Standing("m").reputation, 0.5);
  EXPECT_EQ(r.Standing("m").weight, 1.0);
}

// Saved and restored (a resumed service), every standing goes on as if nothing had happened: the
// same next round, bit for bit. What no run of the rule can reach is refused by name, whole.
TEST(ReputationTest, StandingsSavedAndRestoredGoOnAsBefore) {
  Reputation before(kOptions);
  auto round = [](Reputation& r, int k) {
    const uint64_t s = uint64_t(k) * 4;
    return Round(r, {{"a", Rows(0.010, 0.005, s)}, {"b", Rows(0.010, 0.005, s + 1)},
                     {"m", Rows(-0.030, 0.005, s + 2)}},
                 1, {{"a", Rows(0.004, 0.002, s + 3)}, {"b", Rows(0.004, 0.002, s + 4)}});
  };
  for (int k = 0; k < 4; ++k) round(before, k);
  ASSERT_TRUE(before.Standing("m").excluded);
  Reputation after(kOptions);
  ASSERT_TRUE(after.Restore(before.Save()).ok());
  for (const char* id : {"a", "b", "m"}) {
    EXPECT_EQ(after.Standing(id).reputation, before.Standing(id).reputation) << id;
    EXPECT_EQ(after.Standing(id).excluded, before.Standing(id).excluded) << id;
  }
  const auto next_before = round(before, 4), next_after = round(after, 4);
  for (const char* id : {"a", "b", "m"}) {
    const IslandScore &x = next_before.islands.at(id), &y = next_after.islands.at(id);
    EXPECT_EQ(x.reputation, y.reputation) << id;
    EXPECT_EQ(x.loo_evidence, y.loo_evidence) << id;
    EXPECT_EQ(x.weight, y.weight) << id;
  }

  const auto saved = after.Save();
  const double m_reputation = after.Standing("m").reputation;
  auto refused = [&](std::vector<SavedStanding> bad, const std::string& what) {
    const absl::Status s = after.Restore(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << what << ": " << s;
    EXPECT_NE(std::string(s.message()).find(what), std::string::npos) << s;
    EXPECT_EQ(after.Standing("m").reputation, m_reputation) << what;  // nothing changed
  };
  auto with = [&](auto change) {
    auto v = saved;
    change(v.back());
    return v;
  };
  refused(with([](SavedStanding& s) { s.reputation = 1.5; }), "reputation 1.5");
  refused(with([](SavedStanding& s) { s.loo_evidence = NAN; }), "evidence nan");
  refused(with([](SavedStanding& s) { s.island.clear(); }), "no usable name");
  auto twice = saved;
  twice.push_back(saved.front());
  refused(twice, "'a' is given twice");
  refused(std::vector<SavedStanding>(Reputation::kMaxSaved + 1, saved.front()), "at most 4096");
}

TEST(ReputationTest, TheQuorumKeepsTheBestReputedOfTheExcluded) {
  Reputation r(kOptions);
  for (uint64_t round = 0; round < 6; ++round) {
    const uint64_t s = 5 * round;
    Round(r, {{"a", Rows(0.01, 0.002, s)}, {"b", Rows(0.01, 0.002, s + 1)},
              {"c", Rows(0.01, 0.002, s + 2)}, {"x", Rows(-0.02, 0.002, s + 3)},
              {"y", Rows(-0.005, 0.002, s + 4)}});
  }
  // x hurt twice as much as the median helped (score -1), y half as much (-0.5): both out, y the
  // better reputed.
  ASSERT_TRUE(r.Standing("x").excluded);
  ASSERT_TRUE(r.Standing("y").excluded);
  ASSERT_GT(r.Standing("y").reputation, r.Standing("x").reputation);
  const auto report = Round(r, {{"x", Rows(-0.02, 0.002, 50)}, {"y", Rows(-0.005, 0.002, 51)}},
                            /*quorum=*/1);
  EXPECT_FALSE(report.islands.at("y").excluded);
  EXPECT_EQ(report.islands.at("y").weight, kQuorumWeight);
  EXPECT_TRUE(report.islands.at("x").excluded);
}

TEST(ReputationTest, AProbeThatFailedForAContributionScoresItAsHarmful) {
  Reputation r(kOptions);
  const auto report = Round(r, {{"a", Rows(0.01, 0.002, 1)}, {"b", Rows(0.01, 0.002, 2)},
                                {"c", {}}, {"d", Rows(0.01, 0.002, 3)}});
  EXPECT_EQ(report.islands.at("c").score, -1.0);
  EXPECT_TRUE(std::isnan(report.islands.at("c").improvement));
  EXPECT_NEAR(report.islands.at("c").reputation, 0.6, 1e-12);
  EXPECT_EQ(report.islands.at("a").score, 1.0);
  // A round the probe measured nobody in judges nobody.
  const auto none = Round(r, {{"a", {}}, {"b", {}}});
  EXPECT_EQ(none.islands.at("a").reputation, 1.0);
}

}  // namespace
}  // namespace atl::outer
