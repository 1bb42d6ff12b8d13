// The service's own commands end to end: `atoll loadtest` against a real coordinator process,
// and what `atoll sync-server` refuses before it starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/src/cli/cli_fixture.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;
using testing::Atoll;
using testing::CliTest;

// The load test drives a real coordinator process with synthetic islands over gRPC and reports
// what it measured: every round committed (the coordinator's own log agrees), commit times,
// heartbeat latency, the coordinator's memory against the model's size.
TEST_F(CliTest, LoadtestRunsRoundsThroughARealCoordinator) {
  auto r = Atoll("loadtest --params 200K --islands 2 --rounds 2 --run-dir " + dir_.Join("load") +
                 " --outer.codec=fp4_e2m1 --outer.service_threads=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("round 2/2"));
  EXPECT_THAT(r.output, HasSubstr("p99"));
  const auto report = nlohmann::json::parse(testing::ReadFile(dir_.Join("load/loadtest.json")));
  EXPECT_NEAR(report["params"].get<double>(), 200e3, 40e3);
  EXPECT_EQ(report["codec"], "fp4_e2m1");
  EXPECT_EQ(report["commit_s"].size(), 2u);
  // The service's own commit of each round, from rounds.jsonl's commit_s.
  ASSERT_EQ(report["service_commit_s"].size(), 2u);
  for (int k = 0; k < 2; ++k) EXPECT_GT(report["service_commit_s"][k].get<double>(), 0);
  EXPECT_THAT(r.output, HasSubstr("service commit (aggregation, outer step"));
  EXPECT_GT(report["heartbeats"].get<int>(), 0);
  // Model and 2 FP4 contributions are far below libtorch's own footprint at this size: the peak is
  // bounded by what the process needs anyway, not by a copy per island.
  EXPECT_GT(report["rss_peak"].get<double>(), report["model_bytes"].get<double>());
  EXPECT_LT(report["rss_peak"].get<double>(), 2e9);
  // FP4 E2M1: 4.25 bits per element and a few bytes of headers per chunk.
  EXPECT_NEAR(report["contribution_bytes"].get<double>() / report["params"].get<double>(),
              4.25 / 8, 0.01);
  std::istringstream rounds(testing::ReadFile(dir_.Join("load/coordinator/rounds.jsonl")));
  int n = 0;
  for (std::string line; std::getline(rounds, line); ++n) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["round"], n);
    EXPECT_EQ(j["contributors"].size(), 2u) << line;
    EXPECT_GT(j["commit_s"].get<double>(), 0) << line;
  }
  EXPECT_EQ(n, 2);
}

// The same with SparseLoCo's payloads: 1% of each chunk of 4096 in int2, Elias-Fano indices.
TEST_F(CliTest, LoadtestRunsSparseRounds) {
  auto r = Atoll("loadtest --params 200K --islands 2 --rounds 2 --run-dir " + dir_.Join("load") +
                 " --outer.codec=int2 --outer.topk_density=0.01 --outer.error_feedback=true"
                 " --outer.optimizer=sgd");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("round 2/2"));
  const auto report = nlohmann::json::parse(testing::ReadFile(dir_.Join("load/loadtest.json")));
  EXPECT_EQ(report["codec"], "top-41/4096 int2");
  EXPECT_EQ(report["commit_s"].size(), 2u);
  // About 0.12 bits per parameter (values, scales, indices, headers).
  const double bits = 8 * report["contribution_bytes"].get<double>() / report["params"].get<double>();
  EXPECT_GT(bits, 0.08);
  EXPECT_LT(bits, 0.16);
}

// A shard server needs a well-formed K/N, the coordinator's address and the shard token; the
// config must allow N shards.
TEST_F(CliTest, SyncServerRefusesWhatItCannotServe) {
  const std::string config = " --config " + dir_.Join("tiny.toml");
  auto r = Atoll("sync-server --shard 2/2 --coordinator 127.0.0.1:1" + config);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--shard '2/2' is not K/N"));
  r = Atoll("sync-server --shard 0/2 --coordinator 127.0.0.1:1 --outer.num_fragments=1" + config);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("outer.shards = 2 needs at least as many fragments"));
  r = testing::RunCommand("ATOLL_TOKEN=t ATOLL_SHARD_TOKEN= " + std::string(ATOLL_BIN) +
                          " sync-server --shard 0/2 --coordinator 127.0.0.1:1 "
                          "--outer.num_fragments=2 --model.n_layer=2" + config);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ATOLL_SHARD_TOKEN"));
}

TEST_F(CliTest, LoadtestRefusesWhatItCannotRun) {
  auto r = Atoll("loadtest --params lots --run-dir " + dir_.Join("load"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--params 'lots'"));
  r = Atoll("loadtest --params 1M --shards 40 --run-dir " + dir_.Join("load"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--shards must be 1 to 16"));
  r = Atoll("loadtest --params 1M --shards 3 --outer.num_fragments=2 --run-dir " + dir_.Join("load"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("outer.shards = 3 needs at least as many fragments"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("load")));
}

}  // namespace
}  // namespace atl
