// Whole runs of separate processes over TCP on loopback (tests/src/net/run_util.h): a coordinator
// (or a sharded service) and islands end bit-identical, sync, Streaming, async and token-ended,
// and a killed shard server resumes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "compression/checksum.h"
#include "outer/island/island_sync.h"
#include "outer/base/payload.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "src/net/grpc_server.h"
#include "src/net/grpc_transport.h"
#include "src/cli/chaos.h"
#include "tests/src/net/run_util.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

// Coordinator + 2 islands as separate processes over TCP on loopback: plain DiLoCo, and
// Streaming DiLoCo with 4 fragments, tau = 2 and FP4 payloads (tests/src/net/run_util.h).
// Returns the service's hashes and the run's output.
std::pair<std::map<int, std::vector<std::string>>, std::string> RunAndCheckBitIdentical(
    const std::string& outer_toml, int fragments, const std::string& extra_args = "") {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(dir, outer_toml, extra_args);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  if (run.exit_code != 0) return {};

  // The service's hash after each round of each fragment...
  const auto service = testing::ServiceHashes(dir);
  EXPECT_EQ(service.size(), size_t(fragments));
  // ...equals each island's after the same round.
  for (const char* island : {"island0", "island1"}) {
    std::ifstream metrics(dir.Join(std::string("run/") + island + "/metrics.jsonl"));
    std::map<int, std::vector<std::string>> seen;
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("round")) {
        EXPECT_FALSE(j["resynced"].get<bool>());
        seen[j["fragment"].get<int>()].push_back(j["global_hash"]);
      }
    }
    EXPECT_EQ(seen, service) << island;
    auto summary = nlohmann::json::parse(
        testing::ReadFile(dir.Join(std::string("run/") + island + "/summary.json")));
    EXPECT_EQ(summary["resyncs"], 0);
  }
  auto s0 = nlohmann::json::parse(testing::ReadFile(dir.Join("run/island0/summary.json")));
  auto s1 = nlohmann::json::parse(testing::ReadFile(dir.Join("run/island1/summary.json")));
  EXPECT_EQ(s0["global_hash"], s1["global_hash"]);
  return {service, run.output};
}

TEST(MultiProcessTest, IslandsAndServiceEndBitIdentical) {
  RunAndCheckBitIdentical("sync_every = 4\n", 1);
}

// Streaming DiLoCo with 4 fragments, tau = 2 and FP4 payloads, served by one service and by a
// sharded one (a coordinator that keeps membership only and two shard servers, each its own
// process): every island's copy of each fragment matches the service's (its shard's) after every
// round, and both runs go through the same global parameters, round by round.
TEST(MultiProcessTest, StreamingFourFragmentsOverlappedFp4OnOneServiceAndOnTwoShards) {
  const std::string outer =
      "sync_every = 4\nnum_fragments = 4\nfragment_sync_delay = 2\ncodec = \"fp4_e2m1\"\n"
      "stochastic_rounding = true\n";
  const auto one = RunAndCheckBitIdentical(outer, 4);
  const auto [sharded, output] = RunAndCheckBitIdentical(outer + "shards = 2\n", 4);
  EXPECT_THAT(output, ::testing::HasSubstr("shard 1 of 2 serves fragments 1,3"));
  EXPECT_THAT(output, ::testing::HasSubstr("(shard 1/2): service state written"));
  EXPECT_EQ(sharded, one.first);
}

// The Llama family (grouped-query attention: 2 query heads share 1 key/value head) through the
// same Streaming run: its fragments are groups of its blocks, and every copy stays bit-identical.
TEST(MultiProcessTest, ALlamaModelStreamsFourFragmentsFp4BitIdentical) {
  const auto [service, output] = RunAndCheckBitIdentical(
      "sync_every = 4\nnum_fragments = 4\nfragment_sync_delay = 2\ncodec = \"fp4_e2m1\"\n", 4,
      "--model.arch=llama --model.n_kv_head=1 --model.ffn_hidden=64");
  EXPECT_THAT(output, ::testing::HasSubstr("fp4_e2m1"));
  for (const auto& [fragment, hashes] : service) EXPECT_GE(hashes.size(), 3u) << fragment;
}

// A shard server SIGKILLed mid-run comes back on its address from its durable state: the islands
// retry or rejoin, every round of its fragments commits exactly once and in order, and the run
// ends with every copy bit-identical.
TEST(ChaosTest, AKilledShardServerResumesFromItsDurableState) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(
      dir, "sync_every = 4\nnum_fragments = 2\nshards = 2\nheartbeat_s = 0.2\n",
      "--throttle 4,4 --train.steps=32 --kill shard-1@round4");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("sending SIGKILL to shard-1"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("atoll local: restarting shard-1 with --resume"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("(shard 1/2): resumed run"));
  const auto service = testing::ServiceHashes(dir);
  ASSERT_EQ(service.size(), 2u);
  std::ifstream log(dir.Join("run/shard-1/rounds.jsonl"));
  uint64_t expected = 0;
  for (std::string line; std::getline(log, line); ++expected) {
    EXPECT_EQ(nlohmann::json::parse(line)["round"].get<uint64_t>(), expected);
  }
  // Fragment 1 (offset 2, H = 4, 32 steps): 8 due rounds and a final one. Islands that rejoined
  // resume where no fragment skips a round.
  EXPECT_EQ(expected, 9u);
  for (const char* island : {"island0", "island1"}) {
    auto summary = nlohmann::json::parse(
        testing::ReadFile(dir.Join(std::string("run/") + island + "/summary.json")));
    EXPECT_EQ(summary["step"], 32) << island;
    EXPECT_EQ(summary["global_hash"],
              nlohmann::json::parse(testing::ReadFile(dir.Join("run/island0/summary.json")))["global_hash"])
        << island << "\n" << run.output;
  }
}

// Async mode, island1 eight times slower (a margin over the scheduling noise of steps this small):
// every contribution is applied as it arrives, each island's copy matches the service's at the
// version it caught up to, and both end on the final state.
TEST(MultiProcessTest, AsyncWithAThrottledIslandStaysBitIdentical) {
  testing::TempDir dir;
  // 40 steps per island of budget: long enough for several pushes of the slow island after the
  // fast one has reported its throughput.
  const auto run = testing::RunTwoIslands(dir, "sync_every = 4\nmode = \"async\"\nmax_staleness = 64\n",
                                 "--throttle 1,8 --train.steps=40");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto service = testing::ServiceHashes(dir);
  ASSERT_EQ(service.size(), 1u);
  const auto& versions = service.at(0);
  int64_t tokens = 0;
  int64_t min_h[2] = {4, 4};  // smallest H each island was given
  for (int i = 0; i < 2; ++i) {
    const std::string island = "island" + std::to_string(i);
    std::ifstream metrics(dir.Join("run/" + island + "/metrics.jsonl"));
    int contributions = 0;
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("round")) continue;
      ++contributions;
      // (A contribution refused as too stale on a loaded machine makes the island fetch the state:
      // its copy must then equal the service's at the version fetched, like any other.)
      const size_t v = j["version"].get<size_t>();
      ASSERT_GE(v, 1u);
      ASSERT_LE(v, versions.size());
      EXPECT_EQ(j["global_hash"], versions[v - 1]) << island << " at version " << v;
      min_h[i] = std::min(min_h[i], j["sync_every"].get<int64_t>());
    }
    EXPECT_GT(contributions, 0) << island;
    auto summary =
        nlohmann::json::parse(testing::ReadFile(dir.Join("run/" + island + "/summary.json")));
    EXPECT_EQ(summary["global_hash"], versions.back()) << island;
    tokens += summary["tokens"].get<int64_t>();
  }
  // Dynamic local steps: the slow island is told to sync after fewer steps than H = 4 (the fast
  // one's H depends on how the machine schedules two processes, so it is not checked); together
  // they spend the budget of 2 islands x 40 steps x 4 x 32 tokens.
  EXPECT_LT(min_h[1], 4);
  EXPECT_GE(tokens, 2 * 40 * 4 * 32);
  EXPECT_THAT(run.output, ::testing::HasSubstr("throttled 8.0x"));
}

// Sync rounds that end at the run's tokens (outer.run_end = "tokens"), island1 eight times slower:
// the service gives it fewer steps per round (dynamic local steps), the fast island trains on past
// its own share of steps, every copy equals the service's after every round, and the run ends once
// the committed tokens reach the budget of 2 islands x 40 steps x 4 x 32 tokens.
TEST(MultiProcessTest, SyncEndingAtItsTokensGivesASlowIslandFewerSteps) {
  testing::TempDir dir;
  const auto run = testing::RunTwoIslands(dir, "sync_every = 4\nrun_end = \"tokens\"\n",
                                          "--throttle 1,8 --train.steps=40");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<std::string> rounds = testing::ServiceHashes(dir).at(0);
  int64_t committed = 0;
  for (const auto& j : testing::ServiceRounds(dir)) committed += j["tokens"].get<int64_t>();
  const int64_t budget = 2 * 40 * 4 * 32;
  EXPECT_GE(committed, budget);
  int64_t min_h[2] = {4, 4};
  for (int i = 0; i < 2; ++i) {
    const std::string island = "island" + std::to_string(i);
    std::ifstream metrics(dir.Join("run/" + island + "/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("round")) continue;
      const size_t r = j["round"].get<size_t>();
      ASSERT_LT(r, rounds.size());
      EXPECT_EQ(j["global_hash"], rounds[r]) << island << " at round " << r << "\n" << line << "\n"
                                             << run.output;
      min_h[i] = std::min(min_h[i], j["sync_every"].get<int64_t>());
    }
  }
  EXPECT_LT(min_h[1], 4);
  EXPECT_GT(testing::IslandSummary(dir, "island0")["step"].get<int64_t>(), 40);
  EXPECT_LT(testing::IslandSummary(dir, "island1")["step"].get<int64_t>(), 40);
}

}  // namespace
}  // namespace atl
