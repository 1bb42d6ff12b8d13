// Islands that fail, pause, leave or come back while a run trains, as processes over TCP
// (`atoll local`): every round commits once, every copy ends bit-identical, and the work the
// islands trained reaches the global model (outer/island/rejoin.cc, outer/service/rounds.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/cli/chaos.h"
#include "src/observe/metrics.h"
#include "tests/src/net/run_util.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kTokensPerStep = 4 * 32;  // RunTwoIslands' batch x context
// Streaming DiLoCo of the tests below: 4 fragments, tau = 2, a lease of 1 s.
constexpr const char* kStreamingOuter =
    "sync_every = 8\nnum_fragments = 4\nfragment_sync_delay = 2\nheartbeat_s = 0.2\n"
    "lease_s = 1.0\n";

// Tokens of fragment 0's contributions (each step's once): committed, on time and late, and
// voided. A contribution of no change is voided, its tokens not committed: an island that lands
// its last round with alpha 0 right before a final push of one step pushes zeros for that step
// (its work there was replaced; the service counted it as committed before it voided such
// pushes). At most that one step per island may be voided here.
uint64_t CommittedTokens(const testing::TempDir& dir) {
  uint64_t tokens = 0, voided = 0;
  for (const auto& r : testing::ServiceRounds(dir)) {
    if (r["fragment"] != 0) continue;
    tokens += r["tokens"].get<uint64_t>();
    if (!r.contains("ledger")) continue;
    for (const auto& [island, account] : r["ledger"].items()) {
      voided += account.value("refused", nlohmann::json::object()).value("void (no change)", 0ull);
    }
  }
  EXPECT_LE(voided, 2 * kTokensPerStep) << "voided tokens";
  return tokens + voided;
}

// What to read when the committed tokens come up short: the run's output, then each round the
// service recorded.
std::string WhereTokensWent(const testing::TempDir& dir, const std::string& output) {
  std::string out = output + "\nrounds.jsonl:\n";
  for (const auto& r : testing::ServiceRounds(dir)) out += r.dump() + "\n";
  return out;
}

// Every island named reached `steps` and ends on the same global parameters as the others.
void ExpectFinishedTogether(const testing::TempDir& dir, const std::vector<std::string>& islands,
                            int steps) {
  for (const auto& island : islands) {
    const auto summary = testing::IslandSummary(dir, island);
    EXPECT_EQ(summary["step"], steps) << island;
    EXPECT_EQ(summary["global_hash"], testing::IslandSummary(dir, islands[0])["global_hash"])
        << island;
  }
}

// An island's token account, summed over the rounds' ledgers (outer/service/token_ledger.h).
outer::TokenAccount Account(const testing::TempDir& dir, const std::string& island) {
  outer::TokenAccount sum;
  for (const auto& r : testing::ServiceRounds(dir)) {
    if (r.contains("ledger") && r["ledger"].contains(island)) {
      sum.Add(TokenAccountFromJson(r["ledger"][island]));
    }
  }
  return sum;
}

// Chaos, CI-sized: 3 islands; island1 is SIGKILLed after round 2, island3 joins after round 3
// (taking the dead island's data stream once its lease has run out), the coordinator is SIGKILLed
// after round 6 and restarted from its durable state (the islands rejoin), island2 leaves with
// SIGTERM after round 9. Training reaches its last step; every round commits exactly once and in
// order; the islands alive at the end hold the service's final parameters bit for bit.
TEST(ChaosTest, KillJoinAndLeaveWhileTraining) {
  testing::TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 9));
  testing::WriteFile(dir.Join("run.toml"),
                     "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
                     "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                     "[train]\nsteps = 80\nbatch_size = 4\neval_every = 0\neval_batches = 2\n"
                     "threads = 1\n[optim]\nwarmup_steps = 2\n"
                     "[outer]\nsync_every = 4\nheartbeat_s = 0.2\nlease_s = 1.5\n"
                     "join_warmup_steps = 4\n");
  // Throttled, so that the run lasts a few seconds: long enough for a process to start and join.
  const auto run = testing::RunCommand(
      std::string(ATOLL_BIN) + " local --islands 3 --config " + dir.Join("run.toml") +
      " --run-dir " + dir.Join("run") + " --throttle 4,4,4" +
      " --kill island1@round2 --join island3@round3 --kill coordinator@round6" +
      " --term island2@round9");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("sending SIGKILL to island1"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("island 'island1' declared dead"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("island 'island3' joined at round"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("island 'island2' left at round"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("atoll coordinator: resumed run 'atoll' at round"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("[island0] rejoined at round"));
  // The rejoined islands' first pushes hold work from before the restart: no false flag.
  EXPECT_THAT(run.output, ::testing::Not(::testing::HasSubstr("claims more tokens")));

  std::vector<uint64_t> rounds;
  std::vector<std::string> hashes;
  std::vector<nlohmann::json> contributors;
  std::ifstream log(dir.Join("run/coordinator/rounds.jsonl"));
  for (std::string line; std::getline(log, line);) {
    auto j = nlohmann::json::parse(line);
    rounds.push_back(j["round"].get<uint64_t>());
    hashes.push_back(j["params_hash"]);
    contributors.push_back(j["contributors"]);
  }
  // None lost, none applied twice: rounds 0, 1, ... in order. The run's 20, and one more for
  // each round an island trails the others by: island3 when it joined while a round was open, an
  // island that resumed a few steps behind after the coordinator's restart, or one a loaded
  // machine held past a round's grace window (its push then came late, and both islands' last
  // steps may then share the extra round). Only the islands still training make them.
  ASSERT_GE(rounds.size(), 20u) << run.output;
  std::vector<uint64_t> expected(rounds.size());
  for (uint64_t r = 0; r < expected.size(); ++r) expected[r] = r;
  EXPECT_EQ(rounds, expected);
  for (size_t r = 20; r < rounds.size(); ++r) {
    ASSERT_GE(contributors[r].size(), 1u) << "round " << r << "\n" << run.output;
    for (const std::string trailing : contributors[r]) {
      EXPECT_TRUE(trailing == "island0" || trailing == "island3") << trailing;
    }
  }
  for (const char* island : {"island0", "island3"}) {
    auto summary =
        nlohmann::json::parse(testing::ReadFile(dir.Join(std::string("run/") + island + "/summary.json")));
    EXPECT_EQ(summary["step"], 80) << island;
    EXPECT_EQ(summary["global_hash"], hashes.back()) << island;
    const double loss = summary["val_loss"].get<double>();
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_LT(loss, std::log(256.0));  // below a uniform guess over bytes
  }
}

// An island killed mid-run comes back from its own checkpoint (written in the background every
// 4 steps): it rejoins under its name, restores its AdamW state and data cursor, fetches the
// global parameters, and the run ends with every copy bit-identical.
TEST(ChaosTest, AKilledIslandResumesFromItsCheckpoint) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir,
      "sync_every = 4\nheartbeat_s = 0.2\nlease_s = 2.5\n",
      // Island1's new process must rejoin before island0 ends the run alone: it starts at round
      // 3 of 12, with about 3 s of island0's rounds still to go (a loaded CI machine once took
      // over 1 s to start it, when 1.1 s were left).
      "--throttle 8,8 --train.steps=48 --train.checkpoint_every=4 --kill island1@round2 "
      "--join island1@round3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("[island1] resumed from its checkpoint of step"));
  // First joiners build the seeded initial parameters themselves and check them against the
  // service's hash: nothing downloaded. The restarted island's own parameters are not the
  // service's (3 rounds later): it downloads them.
  EXPECT_THAT(run.output, ::testing::ContainsRegex(
                              "\\[island0\\] joined sync run 'atoll' at round 0: [^\n]*state: 0.0 "
                              "MiB in [^\n]*1 of 1 fragment\\(s\\) its own seeded parameters"));
  EXPECT_THAT(run.output, ::testing::ContainsRegex(
                              "\\[island1\\] joined sync run 'atoll' at round [1-9][^\n]*state: "
                              "0.[1-9] MiB in [0-9.]*s\\)"));
  // It owes the steps it was down for and trains them (the run takes longer): every step of both
  // islands reaches the global model once, and the restart lost at most the steps since its last
  // push (its checkpoint is written at every round).
  const auto service = testing::ServiceHashes(dir);
  ASSERT_GE(service.at(0).size(), 12u);
  EXPECT_EQ(CommittedTokens(dir), 2u * 48 * kTokensPerStep) << WhereTokensWent(dir, run.output);
  EXPECT_LE(Account(dir, "island1").recomputed, 4 * kTokensPerStep) << run.output;
  ExpectFinishedTogether(dir, {"island0", "island1"}, 48);
  EXPECT_EQ(testing::IslandSummary(dir, "island0")["global_hash"], service.at(0).back());
  EXPECT_GT(testing::IslandSummary(dir, "island1")["checkpoints"].get<int>(), 0);
}

// A restarted island of a Streaming run takes part at the position its fragments' rounds put it,
// not fragment 0's alone (a fragment's round starts up to H steps after fragment 0's): each of its
// pushes comes the same number of its own steps (the steps it owes) before the other island's push
// of the same round, and both reach the last step with every token of fragment 0 committed.
// Pushing at fragment 0's position, it would run H steps out of step and wait on the other island
// at the end until the round deadline.
TEST(ChaosTest, ARestartedIslandOfAStreamingRunPushesEachRoundAtTheRunsPosition) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir,
      std::string(kStreamingOuter) + "round_timeout_s = 20\n",
      "--throttle 8,8 --train.steps=64 --kill island1@round6 --join island1@round10");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("sending SIGKILL to island1"));
  // The round its new process joined at: its pushes from there on.
  const std::string joined = "[island1] joined sync run 'atoll' at round ";
  const auto at = run.output.find(joined, run.output.find(joined) + 1);
  ASSERT_NE(at, std::string::npos) << run.output;
  const int rejoined = std::stoi(run.output.substr(at + joined.size()));
  // (fragment, round) -> the step each island pushed it at.
  std::map<std::pair<int, int>, int> pushed[2];
  const char* islands[] = {"island0", "island1"};  // island1 resumed in its own directory
  for (int i = 0; i < 2; ++i) {
    std::ifstream metrics(dir.Join(std::string("run/") + islands[i] + "/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("round")) continue;
      pushed[i][{j["fragment"].get<int>(), j["round"].get<int>()}] = j["pushed_at"].get<int>();
    }
  }
  int shared = 0;
  std::set<int> lags;  // the other island's step minus the restarted one's, for the same round
  for (const auto& [round, step] : pushed[1]) {
    // Not its last pushes: an island ends the run pushing every fragment after its last step.
    if (!pushed[0].count(round) || round.second <= rejoined || step == 64 ||
        pushed[0].at(round) == 64) {
      continue;
    }
    ++shared;
    lags.insert(pushed[0].at(round) - step);
  }
  EXPECT_GE(shared, 8) << run.output;  // the restarted island's rounds, at least two per fragment
  EXPECT_EQ(lags.size(), 1u) << run.output;
  EXPECT_GE(*lags.begin(), 0);
  EXPECT_EQ(CommittedTokens(dir), 2u * 64 * kTokensPerStep) << WhereTokensWent(dir, run.output);
  ExpectFinishedTogether(dir, {"island0", "island1"}, 64);
}

// --chaos, CI-sized: failures drawn from a seed (SIGKILL, then a restart from the checkpoint;
// SIGSTOP past the lease) while 2 islands train. The run reaches its last round, every island
// that finishes ends on global parameters the service committed (the same ones unless one came
// back just as the other ended the run alone), and the report counts the tokens that reached the
// global model.
TEST(ChaosTest, RandomFailuresFromASeedAreSurvivedAndMeasured) {
  testing::TempDir dir;
  const std::string chaos = "seed=11,every=2,down=1.5";
  ASSERT_LT(ChaosPlan(*ParseChaos(chaos), 2).Next().at_s, 2.0);  // the first comes early
  // A victim that comes back after the other island has ended the run alone gives up within 5 s.
  const auto run = testing::RunTwoIslands(
      dir, "sync_every = 4\nheartbeat_s = 0.2\nlease_s = 1.0\nreconnect_timeout_s = 5\n",
      "--throttle 8,8 --train.steps=48 --train.checkpoint_every=4 --chaos " + chaos);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("atoll local: chaos: goodput "));
  const auto report = nlohmann::json::parse(testing::ReadFile(dir.Join("run/chaos.json")));
  EXPECT_GE(report["failures"].get<int>(), 1) << run.output;
  // Every island that finished holds global parameters the service committed, the last to finish
  // its final ones. A victim that comes back in the moment between the other's end and the
  // coordinator's may rejoin and train its own last steps alone: then the two differ, and the
  // report says so.
  const std::vector<std::string> committed = testing::ServiceHashes(dir).at(0);
  std::set<std::string> ended;
  bool last_ended_on_final = false;
  for (const char* island : {"island0", "island1"}) {
    if (!std::filesystem::exists(dir.Join(std::string("run/") + island + "/summary.json"))) continue;
    const std::string hash = testing::IslandSummary(dir, island)["global_hash"];
    EXPECT_NE(std::find(committed.begin(), committed.end(), hash), committed.end())
        << island << "\n" << run.output;
    ended.insert(hash);
    last_ended_on_final |= hash == committed.back();
  }
  EXPECT_TRUE(last_ended_on_final) << run.output;
  EXPECT_EQ(report["identical"].get<bool>(), ended.size() == 1) << run.output;
  EXPECT_GE(report["finished"].get<int>(), 1);
  EXPECT_GE(report["rounds"].get<int>(), 12);
  EXPECT_EQ(report["tokens_expected"].get<uint64_t>(), 2u * 48 * 4 * 32);
  const double goodput = report["goodput"].get<double>();
  EXPECT_GT(goodput, 0);
  EXPECT_LE(goodput, 1.0);
  // What reached the global model is what the service's rounds record.
  uint64_t tokens = 0;
  std::ifstream rounds(dir.Join("run/coordinator/rounds.jsonl"));
  for (std::string line; std::getline(rounds, line);) tokens += nlohmann::json::parse(line)["tokens"].get<uint64_t>();
  EXPECT_EQ(report["tokens_committed"].get<uint64_t>(), tokens);
  // The ledger's account: everything committed was trained; on time and stale make the goodput.
  const auto& account = report["token_account"];
  EXPECT_EQ(account["on_time"].get<uint64_t>() + account["stale"].get<uint64_t>(), tokens);
  EXPECT_GE(account["trained"].get<uint64_t>(), tokens);
}


// A straggler whose pushes come after their rounds committed without it (the round deadline,
// min_islands = 1) and too stale to be folded in (outer.max_staleness = 0) is refused, and its
// steps are not lost: it keeps its progress on the new global parameters and its next push that
// arrives in time carries them and claims their tokens. Every token of both islands commits.
TEST(ChaosTest, AStragglersRefusedPushesGoWithItsNextPush) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir, "sync_every = 4\nmax_staleness = 0\nround_timeout_s = 1\nmin_islands = 1\n",
      "--throttle 5,80 --train.steps=16");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("was refused (round "));
  EXPECT_THAT(run.output, HasSubstr("its steps go with its next push"));
  EXPECT_EQ(CommittedTokens(dir), 2u * 16 * kTokensPerStep) << WhereTokensWent(dir, run.output);
  // island0 waits for the run's end at most the round deadline; the straggler ends on the last
  // round it committed alone.
  const auto summary = testing::IslandSummary(dir, "island1");
  EXPECT_EQ(summary["step"], 16);
  EXPECT_EQ(summary["global_hash"], testing::ServiceHashes(dir).at(0).back());
}

// An island paused (SIGSTOP) past its lease mid-round is dropped; the round goes on without it
// after its grace window. When it comes back it rejoins keeping its progress: the steps it had
// trained towards the round it missed are carried onto the new global parameters and reach the
// model with its next push, and it trains the steps it owes. Nothing it trained is lost: fragment
// 0's rounds commit every token of both islands, and every copy ends bit-identical.
TEST(ChaosTest, APausedIslandKeepsItsProgress) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir, "sync_every = 4\nheartbeat_s = 0.2\nlease_s = 1.0\n",
      "--throttle 30,30 --train.steps=32 --stop island1@round2:2.5");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("SIGSTOP to island1 for 2.5 s"));
  EXPECT_THAT(run.output, HasSubstr("island 'island1' declared dead"));
  EXPECT_THAT(run.output, HasSubstr("[island1] rejoined at round"));
  EXPECT_THAT(run.output, HasSubstr("keeping its progress"));
  EXPECT_EQ(CommittedTokens(dir), 2u * 32 * kTokensPerStep) << WhereTokensWent(dir, run.output);
  ExpectFinishedTogether(dir, {"island0", "island1"}, 32);
  EXPECT_EQ(testing::IslandSummary(dir, "island0")["global_hash"],
            testing::ServiceHashes(dir).at(0).back());
}

// The same with 4 fragments and tau = 2 (Streaming): the paused island's work reaches each
// fragment's open round (on time, or late into the next one), and its rounds after the rejoin
// include it in every fragment.
TEST(ChaosTest, APausedStreamingIslandReachesEachFragmentsOpenRound) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir,
      kStreamingOuter,
      "--throttle 30,30 --train.steps=48 --stop island1@round6:2.5");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("keeping its progress"));
  EXPECT_EQ(CommittedTokens(dir), 2u * 48 * kTokensPerStep) << WhereTokensWent(dir, run.output);
  // After its rejoin, each fragment commits rounds with island1's contributions. (Under load the
  // pause may end before any round went on without it: the rejoin's round is the mark.)
  const std::string joined = "island 'island1' joined at round ";
  const size_t at = run.output.find(joined);
  ASSERT_NE(at, std::string::npos) << run.output;
  const int rejoined = std::stoi(run.output.substr(at + joined.size()));
  std::map<int, int> with_it;
  for (const auto& r : testing::ServiceRounds(dir)) {
    const auto& c = r["contributors"];
    const bool has = std::find(c.begin(), c.end(), "island1") != c.end();
    if (has && r["round"].get<int>() > rejoined) with_it[r["fragment"].get<int>()] += 1;
  }
  for (int f = 0; f < 4; ++f) EXPECT_GE(with_it[f], 1) << "fragment " << f << "\n" << run.output;
  ExpectFinishedTogether(dir, {"island0", "island1"}, 48);
}

// An island told to leave (SIGTERM) mid-round pushes what it trained since its last push, with
// the tokens of exactly those steps, before it leaves: its steps all reach the global model, and
// the other island ends the run alone.
TEST(ChaosTest, ALeavingIslandPushesItsLastSteps) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      // tau = 3: the island trains on after its push, so that the SIGTERM finds it mid-round.
      dir, "sync_every = 8\nfragment_sync_delay = 3\nheartbeat_s = 0.2\nlease_s = 1.0\n",
      // No evaluation at the round's step: the SIGTERM finds the island training, not evaluating.
      "--throttle 30,30 --train.steps=48 --train.eval_every=0 --term island1@round3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto left = testing::IslandSummary(dir, "island1");
  const uint64_t trained = left["step"].get<uint64_t>();
  EXPECT_LT(trained, 48u);
  // Mid-round (the usual case) it pushes the steps since its last push; on a loaded host the
  // SIGTERM can land exactly on a push, with nothing left to send.
  if (trained % 8 != 0) {
    EXPECT_THAT(run.output, HasSubstr("[island1] leaving: the last ")) << run.output;
  }
  // Island1's share of the committed tokens, from the rounds' token ledger: all it trained.
  uint64_t island1 = 0;
  for (const auto& r : testing::ServiceRounds(dir)) {
    if (!r.contains("ledger") || !r["ledger"].contains("island1")) continue;
    const auto& a = r["ledger"]["island1"];
    island1 += a.value("on_time", uint64_t(0)) + a.value("stale", uint64_t(0));
  }
  EXPECT_EQ(island1, trained * kTokensPerStep) << run.output;
  EXPECT_EQ(CommittedTokens(dir), (48 + trained) * kTokensPerStep)
      << WhereTokensWent(dir, run.output);
}

// outer.moment_sync_every = 2 over TCP: at every second round each island's AdamW moments go to
// the service before its pseudo-gradient and the average comes back once the round has committed;
// an island joining mid-run (no checkpoint) starts from the newest average instead of zeros. The
// parameters are untouched by it: every copy still ends bit-identical.
TEST(ChaosTest, IslandsAverageTheirMomentsAndAJoinerStartsFromThem) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir, "sync_every = 4\nmoment_sync_every = 2\nheartbeat_s = 0.2\nlease_s = 2.5\n",
      "--throttle 8,8 --train.steps=48 --term island1@round3 --join island2@round4");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // island2 takes the stream island1 left; it has no checkpoint.
  EXPECT_THAT(run.output, ::testing::ContainsRegex(
                              "\\[island2\\] joined sync run [^\n]*optimizer moments: the "
                              "run's average \\(1 fragment"));
  // Rounds 1, 3, ..., 11 of the 12, but for a push that came late under load (the round committed
  // without it: its moments are not taken either): each one it loaded, it said.
  const int island0 = testing::IslandSummary(dir, "island0")["moment_rounds"].get<int>();
  EXPECT_GE(island0, 4) << run.output;
  EXPECT_LE(island0, 6) << run.output;
  size_t said = 0;
  for (size_t at = run.output.find("[island0] fragment 0 round "); at != std::string::npos;
       at = run.output.find("[island0] fragment 0 round ", at + 1)) {
    const std::string line = run.output.substr(at, run.output.find('\n', at) - at);
    if (line.find("optimizer moments averaged") != std::string::npos) ++said;
  }
  EXPECT_EQ(size_t(island0), said) << run.output;
  EXPECT_GE(testing::IslandSummary(dir, "island1")["moment_rounds"].get<int>(), 1) << run.output;
  EXPECT_GE(testing::IslandSummary(dir, "island2")["moment_rounds"].get<int>(), 1) << run.output;
  const auto last = testing::ServiceHashes(dir).at(0).back();
  for (const std::string island : {"island0", "island2"}) {
    EXPECT_EQ(testing::IslandSummary(dir, island)["global_hash"], last) << island;
  }
}

// Ranks that share ranges (tensor parallelism, replicated shards) would part if each loaded its own
// share of an average: such an island keeps its moments, says so when it joins, and pushes none.
TEST(ChaosTest, TensorParallelIslandsKeepTheirOwnMomentsAndSayIt) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir, "sync_every = 4\nmoment_sync_every = 1\n",
      "--nproc 2 --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const std::string island : {"island0", "island1"}) {
    EXPECT_THAT(run.output, ::testing::ContainsRegex(
                                "\\[" + island + "[^\n]*\\] joined sync run [^\n]*optimizer "
                                "moments: its own, not averaged"));
    EXPECT_EQ(testing::IslandSummary(dir, island)["moment_rounds"], 0) << island;
  }
  // Of each island's rank 0's part: the same on both.
  EXPECT_EQ(testing::IslandSummary(dir, "island0")["global_hash"],
            testing::IslandSummary(dir, "island1")["global_hash"]);
}

}  // namespace
}  // namespace atl
