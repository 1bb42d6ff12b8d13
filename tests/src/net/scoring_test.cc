// Contributions earn their weight, through the real service over TCP (`atoll local`, outer.scoring
// = "loss_probe"): hostile islands that send well-formed, in-bounds contributions (negated, noise
// of its norm, trained on shuffled tokens) are left out within a few rounds, a copier weighs as one
// with the island it copies, the honest ones keep their full weight in every round, and every
// copy of the parameters, the hostile islands' too, ends bit-identical.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/src/net/run_util.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

// `atoll local` of `islands` islands on a 2-layer model, H = 4, `steps` steps, the loss probe on;
// `args` adds the roles. The text: generated sentences, or `text`.
testing::CommandResult RunScored(const testing::TempDir& dir, int islands, int steps,
                                 const std::string& args, const std::string& text = "") {
  testing::WriteFile(dir.Join("text.txt"), text.empty() ? testing::GeneratedText(60000, 9) : text);
  testing::WriteFile(
      dir.Join("run.toml"),
      "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
      "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
      "[train]\nsteps = " + std::to_string(steps) + "\nbatch_size = 4\neval_every = 0\n"
      "threads = 1\n[optim]\nwarmup_steps = 2\n"
      "[outer]\nsync_every = 4\nscoring = \"loss_probe\"\nprobe_batches = 8\n");
  return testing::RunCommand(std::string(ATOLL_BIN) + " local --islands " +
                             std::to_string(islands) + " --config " + dir.Join("run.toml") +
                             " --run-dir " + dir.Join("run") + " " + args);
}

// Every island ends on the service's last parameters.
void ExpectBitIdentical(const testing::TempDir& dir, int islands) {
  const auto last = testing::ServiceHashes(dir).at(0).back();
  for (int i = 0; i < islands; ++i) {
    const std::string island = "island" + std::to_string(i);
    EXPECT_EQ(testing::IslandSummary(dir, island)["global_hash"], last) << island;
  }
}

// An island's score in a round's record; null where the round did not score it: under load an
// island may push late (its contribution folds into the next round unscored) or miss a round.
// (A const json's operator[] on an absent key is undefined behaviour, not an error.)
nlohmann::json ScoreOf(const nlohmann::json& r, const std::string& island) {
  if (!r.contains("scores") || !r["scores"].contains(island)) return nlohmann::json();
  return r["scores"][island];
}

bool Excluded(const nlohmann::json& r, const std::string& island) {
  const auto score = ScoreOf(r, island);
  return !score.is_null() && score["excluded"] == true;
}

// A round's record holds scores, the honest islands it scored at full weight, and none left out.
void ExpectHonestAtFullWeight(const nlohmann::json& r, const std::vector<std::string>& honest) {
  ASSERT_TRUE(r.contains("scores")) << r.dump();
  for (const auto& island : honest) {
    const auto score = ScoreOf(r, island);
    if (score.is_null()) {
      EXPECT_THAT(r.value("dropped", nlohmann::json::array()).dump(),
                  ::testing::Not(HasSubstr(island)))
          << r.dump();
      continue;
    }
    EXPECT_EQ(score["weight"], 1.0) << r.dump();
    EXPECT_EQ(score["excluded"], false) << r.dump();
  }
}

TEST(ScoringTest, HostileIslandsAreLeftOutAndHonestOnesKeepTheirWeight) {
  testing::TempDir dir;
  const auto run = RunScored(dir, 4, 48,
                             "--island-set island2:outer.fault=sign_flip "
                             "--island-set island3:outer.fault=noise");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("island 'island2' left out: its contribution harms"));
  const auto rounds = testing::ServiceRounds(dir);
  ASSERT_EQ(rounds.size(), 12u);
  std::map<std::string, int> left_out_at;  // the first round each hostile island was left out
  for (const auto& r : rounds) {
    ExpectHonestAtFullWeight(r, {"island0", "island1"});
    for (const char* hostile : {"island2", "island3"}) {
      if (Excluded(r, hostile) && !left_out_at.count(hostile)) left_out_at[hostile] = r["round"];
      if (left_out_at.count(hostile) && !ScoreOf(r, hostile).is_null()) {
        EXPECT_EQ(ScoreOf(r, hostile)["weight"], 0.0) << r.dump();
        EXPECT_THAT(r.value("dropped", nlohmann::json::array()).dump(), HasSubstr(hostile));
      }
    }
  }
  // Negated, it hurts the held-out loss (t about -60 against the median); noise buys nothing
  // while the median buys much (t about -90). Each is left out of the rounds it harms from the
  // first, while its reputation decays (below 0.2 by the third and eighth rounds).
  EXPECT_LE(left_out_at.at("island2"), 1) << run.output;
  EXPECT_LE(left_out_at.at("island3"), 1) << run.output;
  ExpectBitIdentical(dir, 4);
}

// An island negated for its first 3 rounds is left out, still scored, and readmitted once its
// honest contributions have brought its reputation back to the floor after its time out
// (outer.exclude_rounds = 3 of its rounds); it then weighs fully again.
TEST(ScoringTest, AnIslandThatTurnsHonestIsReadmitted) {
  testing::TempDir dir;
  const auto run = RunScored(dir, 3, 48,
                             "--outer.exclude_rounds=3 --island-set island2:outer.fault=sign_flip "
                             "--island-set island2:outer.fault_rounds=3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  int left_out = -1, readmitted = -1;
  double last_weight = -1;
  for (const auto& r : testing::ServiceRounds(dir)) {
    ExpectHonestAtFullWeight(r, {"island0", "island1"});
    const auto m = ScoreOf(r, "island2");
    if (m.is_null()) continue;  // it pushed late: unscored at full weight
    if (m["excluded"] == true && left_out < 0) left_out = r["round"];
    if (m["excluded"] == false && left_out >= 0 && readmitted < 0) readmitted = r["round"];
    last_weight = m["weight"];
  }
  EXPECT_GE(left_out, 0) << run.output;
  EXPECT_LE(left_out, 2);
  EXPECT_GT(readmitted, left_out + 2) << run.output;  // its time out: 3 of its rounds
  EXPECT_EQ(last_weight, 1.0);
  ExpectBitIdentical(dir, 3);
}

// An island that trains on shuffled tokens (garbage) learns only the bytes' frequencies. On a text
// whose order is everything (the alphabet, repeated) the others learn far more from the first
// round, and it is left out within two. The round's average does better without it from the
// first round on (leave-one-out, its t the lowest and negative), and worse without any other.
TEST(ScoringTest, AnIslandTrainingOnShuffledTokensIsLeftOut) {
  testing::TempDir dir;
  std::string alphabets;
  while (alphabets.size() < 60000) alphabets += "abcdefghijklmnopqrstuvwxyz";
  const auto run =
      RunScored(dir, 4, 48, "--island-set island3:data.shuffle_tokens=true", alphabets);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  int left_out_at = -1;
  const auto rounds = testing::ServiceRounds(dir);
  ASSERT_FALSE(rounds.empty());
  // The first round that scored all four (under load one may push round 0 late).
  const nlohmann::json* first = nullptr;
  for (const auto& r : rounds) {
    if (r["contributors"].size() == 4u) {  // all on time, none left out
      first = &r;
      break;
    }
  }
  ASSERT_NE(first, nullptr) << run.output;
  EXPECT_LT(ScoreOf(*first, "island3")["loo_t"].get<double>(), -4) << first->dump();
  for (const char* honest : {"island0", "island1", "island2"}) {
    EXPECT_GT(ScoreOf(*first, honest)["loo_t"].get<double>(), 0) << first->dump();
  }
  bool folded_in = false;  // island3 was in the last commit, so the outer momentum carries it
  for (const auto& r : rounds) {
    ExpectHonestAtFullWeight(r, {"island0", "island1", "island2"});
    const bool excluded = Excluded(r, "island3");
    if (excluded && left_out_at < 0) left_out_at = r["round"];
    // The step guard (outer.step_guard) probed the round's plain average and its outer step, and
    // committed the average where the step overshoots or the round leaves island3 out after a
    // commit that folded it in.
    ASSERT_TRUE(r.contains("probe_average_loss") && r.contains("probe_step_loss")) << r.dump();
    EXPECT_GT(r["probe_average_loss"].get<double>(), 0) << r.dump();
    EXPECT_GT(r["probe_step_loss"].get<double>(), 0) << r.dump();
    const bool overshoots =
        r["probe_step_loss"].get<double>() > 1.1 * r["probe_average_loss"].get<double>();
    EXPECT_EQ(r["step_guarded"].get<bool>(), overshoots || (excluded && folded_in)) << r.dump();
    folded_in = false;
    for (const char* key : {"contributors", "stale_contributors"}) {
      if (!r.contains(key)) continue;
      for (const auto& c : r[key]) folded_in = folded_in || c == "island3";
    }
  }
  EXPECT_GE(left_out_at, 0) << run.output;
  EXPECT_LE(left_out_at, 2) << run.output;
  ExpectBitIdentical(dir, 4);
}

// Standings are part of the durable state: the coordinator, killed at round 5 and resumed, goes on
// from the negated island's reputation (below 0.2 from its third round; a fresh one would start at
// 1 and fall to 0.6) instead of letting it back in at full weight.
TEST(ScoringTest, AResumedCoordinatorKeepsEachIslandsStanding) {
  testing::TempDir dir;
  const auto run = RunScored(dir, 3, 48,
                             "--island-set island2:outer.fault=sign_flip --kill coordinator@round5");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_THAT(run.output, HasSubstr("atoll coordinator: resumed run"));
  const auto rounds = testing::ServiceRounds(dir);
  ASSERT_GE(rounds.size(), 12u) << run.output;
  int low = 0;
  for (const auto& r : rounds) {
    ExpectHonestAtFullWeight(r, {"island0", "island1"});
    const auto m = ScoreOf(r, "island2");
    if (m.is_null()) continue;  // it pushed late
    EXPECT_EQ(m["weight"], 0.0) << r.dump();
    if (r["round"].get<int>() >= 3) {
      EXPECT_LT(m["reputation"].get<double>(), 0.2) << r.dump();
      ++low;
    }
  }
  EXPECT_GE(low, 9);  // rounds 3-4 before the kill, 6-11 after the resume at least
  ExpectBitIdentical(dir, 3);
}

// A copier (outer.fault = "copy": it trains another island's data stream with that island's
// seeds) sends that island's payloads. With outer.copy_cosine set, every round that holds both
// flags the two as copies and they weigh as one; the probe finds the copy as good as the original.
TEST(ScoringTest, ACopierAndTheIslandItCopiesWeighAsOne) {
  testing::TempDir dir;
  const auto run =
      RunScored(dir, 3, 32, "--outer.copy_cosine=0.99 --island-set island2:outer.fault=copy");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("rehearsing a copier"));
  const auto rounds = testing::ServiceRounds(dir);
  ASSERT_EQ(rounds.size(), 8u);
  int with_all = 0;
  for (const auto& r : rounds) {
    ExpectHonestAtFullWeight(r, {"island0", "island1", "island2"});
    if (r["contributors"].size() < 3) continue;  // one pushed late (under load): no pair to see
    ++with_all;
    ASSERT_TRUE(r.contains("copies")) << r.dump();
    ASSERT_EQ(r["copies"].size(), 1u) << r.dump();
    const auto& group = r["copies"][0];
    EXPECT_EQ(group.size(), 2u) << r.dump();
    EXPECT_THAT(group.dump(), HasSubstr("island2")) << r.dump();
  }
  EXPECT_GE(with_all, 4) << run.output;
  ExpectBitIdentical(dir, 3);
}

}  // namespace
}  // namespace atl
