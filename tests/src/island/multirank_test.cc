// Islands of several ranks as separate processes over TCP: every rank's ranges bit-identical with
// the service after every round, the result against one-rank islands, and a rank killed mid-run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"

#include "src/service/coordinator.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

std::string WriteRunConfig(const testing::TempDir& dir, const std::string& extra = "") {
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 9));
  testing::WriteFile(dir.Join("run.toml"),
                     "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
                     "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                     "[train]\nsteps = 24\nbatch_size = 2\neval_every = 12\neval_batches = 2\n"
                     "threads = 1\n[optim]\nwarmup_steps = 2\n[outer]\nsync_every = 6\n"
                     "[parallelism]\ncollective_timeout_s = 10\n" + extra);
  return dir.Join("run.toml");
}

testing::CommandResult Local(const testing::TempDir& dir, const std::string& name,
                             const std::string& args) {
  return testing::RunCommand(std::string(ATOLL_BIN) + " local --islands 2 --config " +
                             dir.Join("run.toml") + " --run-dir " + dir.Join(name) + " " + args);
}

// Every rank's range hashes in its metrics against the service's after the same round; returns
// how many were compared.
int ExpectRangesMatchTheService(const std::string& run) {
  std::map<std::pair<int, int>, nlohmann::json> service;
  std::ifstream rounds(run + "/coordinator/rounds.jsonl");
  for (std::string line; std::getline(rounds, line);) {
    auto j = nlohmann::json::parse(line);
    auto hashes = j.value("range_hashes", nlohmann::json::object());
    hashes["whole"] = j["params_hash"];
    service[{j["fragment"].get<int>(), j["round"].get<int>()}] = hashes;
  }
  int compared = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(run)) {
    const std::string file = e.path().filename().string();
    if (file.rfind("metrics", 0) != 0) continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("range_hashes")) continue;
      const auto& want = service.at({j["fragment"].get<int>(), j["round"].get<int>()});
      for (const auto& [range, hash] : j["range_hashes"].items()) {
        const std::string key = want.contains(range) ? range : "whole";
        EXPECT_EQ(hash, want[key]) << e.path() << " round " << j["round"] << " range " << range;
        ++compared;
      }
    }
  }
  return compared;
}

std::vector<float> ServiceParams(const std::string& run) {
  auto state = ReadServiceState(run + "/coordinator/service-state.pb");
  EXPECT_TRUE(state.ok()) << state.status();
  std::vector<float> all;
  for (const auto& f : state->fragments()) {
    const size_t n = f.params().size() / 4;
    const float* p = reinterpret_cast<const float*>(f.params().data());
    all.insert(all.end(), p, p + n);
  }
  return all;
}

// The final global parameters of two runs agree to 1e-4 relative (L2): the same training up to
// the order of the sums.
void ExpectServiceParamsClose(const std::string& run, const std::string& reference,
                              const std::string& what) {
  const auto a = ServiceParams(run), b = ServiceParams(reference);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, norm = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += double(a[i] - b[i]) * double(a[i] - b[i]);
    norm += double(b[i]) * double(b[i]);
    worst = std::max(worst, double(std::abs(a[i] - b[i])));
  }
  std::printf("%s, final parameters: relative L2 difference %.2e, largest %.2e\n", what.c_str(),
              std::sqrt(diff / norm), worst);
  EXPECT_LT(std::sqrt(diff / norm), 1e-4) << what;
}

// 2 islands of 2 ranks of the mesh `mesh_args` (described as `mesh` in the island's log): every
// rank's ranges bit-identical with the service after every round (at least `min_compared` range
// hashes), and the final global parameters equal to those of 2 one-rank islands run with
// `single_args` (the same global batch) up to the order of the sums. Returns the islands' output.
std::string ExpectTwoRankIslandsMatchOneRankIslands(const std::string& mesh_args,
                                                    const std::string& mesh, int min_compared,
                                                    const std::string& single_args) {
  testing::TempDir dir;
  WriteRunConfig(dir);
  auto ranks = Local(dir, "ranks", "--nproc 2 " + mesh_args);
  EXPECT_EQ(ranks.exit_code, 0) << ranks.output;
  if (ranks.exit_code != 0) return ranks.output;
  EXPECT_THAT(ranks.output, HasSubstr("2 ranks (" + mesh + ")"));
  EXPECT_GE(ExpectRangesMatchTheService(dir.Join("ranks")), min_compared);
  auto single = Local(dir, "single", single_args);
  EXPECT_EQ(single.exit_code, 0) << single.output;
  if (single.exit_code == 0) {
    ExpectServiceParamsClose(dir.Join("ranks"), dir.Join("single"), mesh + " vs 1 rank");
  }
  return ranks.output;
}

// (c) 2 islands x 2 FSDP ranks over gRPC: four rank streams, every rank's ranges bit-identical
// with the service after every round; the result against 2 islands x 1 rank with the same global
// batch (batch 2 per rank vs 4).
TEST(MultiRankTest, TwoIslandsOfTwoShardsStayBitIdenticalAndMatchOneRankIslands) {
  // islands x ranks x rounds x (a range per unit)
  ExpectTwoRankIslandsMatchOneRankIslands("--parallelism.data_parallel_shard_degree=2",
                                          "pp 1 x dp_replicate 1 x dp_shard 2 x tp 1", 2 * 2 * 4 * 4,
                                          "--train.batch_size=4");
}

// 2 islands x 2 tensor-parallel ranks: each rank pushes and receives only its part of the split
// parameters, TP rank 0 alone the whole ones (the others' copies follow it); the same batch as
// one rank.
TEST(MultiRankTest, TwoIslandsOfTwoTensorParallelRanksStayBitIdenticalAndMatchOneRankIslands) {
  ExpectTwoRankIslandsMatchOneRankIslands(
      "--parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=1",
      "pp 1 x dp_replicate 1 x dp_shard 1 x tp 2", 2 * 2 * 4 * 2, "");
}

// 2 islands x 2 pipeline stages (2 micro-batches, 1F1B) with Streaming DiLoCo's 2 fragments, one
// per stage (embeddings and block 0 | block 1 and the head): each stage pushes and receives its own
// fragment only, and rank 0 (stage 0) carries nothing of fragment 1, whose news the island takes
// from stage 1; the same batch as one rank.
TEST(MultiRankTest, TwoIslandsOfTwoPipelineStagesStayBitIdenticalAndMatchOneRankIslands) {
  const std::string fragments = "--outer.num_fragments=2 --outer.fragment_pattern=sequential ";
  const std::string output = ExpectTwoRankIslandsMatchOneRankIslands(
      fragments + "--parallelism.pipeline_parallel_degree=2 "
                  "--parallelism.data_parallel_shard_degree=1 "
                  "--parallelism.pipeline_parallel_microbatches=2",
      "pp 2 x dp_replicate 1 x dp_shard 1 x tp 1", 2 * 2 * 4, fragments);
  // Rank 0 logs fragment 1's rounds: it sent nothing and reports stage 1's answer.
  int reported = 0;
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(output, '\n'))) {
    if (line.find("fragment 1 round") == std::string::npos || line.find(" merged ") == std::string::npos) {
      continue;
    }
    EXPECT_THAT(line, HasSubstr("sent 0 KiB, 2 contributors"));
    ++reported;
  }
  EXPECT_GE(reported, 2 * 4);
}

// 2 islands x 2 replicas (HSDP): replica 0 alone pushes and receives, the other replica carries
// nothing over the WAN and takes replica 0's merged parameters inside the island; the same global
// batch as one rank.
TEST(MultiRankTest, TwoIslandsOfReplicatedShardsPushOnceAndMatchOneRankIslands) {
  ExpectTwoRankIslandsMatchOneRankIslands(
      "--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1",
      "pp 1 x dp_replicate 2 x dp_shard 1 x tp 1", 2 * 1 * 4, "--train.batch_size=4");
}

// (e) A rank killed mid-run: the island's other rank fails its next collective at once and exits;
// the island's agent restarts the island from its checkpoint; the run completes with every
// surviving copy bit-identical with the service.
TEST(MultiRankTest, AKilledRankRestartsItsIslandFromItsCheckpoint) {
  testing::TempDir dir;
  WriteRunConfig(dir);
  const auto run = Local(dir, "run",
                         "--nproc 2 --max-restarts 1 --parallelism.data_parallel_shard_degree=2 "
                         "--train.checkpoint_every=6 --train.steps=120 --outer.heartbeat_s=0.2 "
                         "--outer.lease_s=2 --throttle 3,3 --kill island0.1@round2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("sending SIGKILL to rank 1 of island0"));
  EXPECT_THAT(run.output, HasSubstr("rank 1 failed (killed by signal 9)"));
  EXPECT_THAT(run.output, HasSubstr("restarting the island from its newest checkpoint"));
  EXPECT_THAT(run.output, HasSubstr("[island0] resumed from its checkpoint of step"));
  EXPECT_GT(ExpectRangesMatchTheService(dir.Join("run")), 0);
  auto summary = nlohmann::json::parse(testing::ReadFile(dir.Join("run/island0/summary.json")));
  EXPECT_EQ(summary["step"], 120);
}

// Each rank fetches its ranges of the global state for itself. When a round commits between the
// ranks' fetches (here: the restarted island's rank 0 is paused right after the island joined,
// while the other island commits the round it joined in), the ranks must still go on from one
// round: otherwise they push to different rounds, neither is ever whole, and the run hangs until
// the round deadline (it did, once, in CI).
TEST(MultiRankTest, ARoundCommittedBetweenTheRanksFetchesDoesNotSplitTheIsland) {
  testing::TempDir dir;
  WriteRunConfig(dir);
  ChildProcess local({ATOLL_BIN, "local", "--islands", "2", "--config", dir.Join("run.toml"),
                      "--run-dir", dir.Join("run"), "--nproc", "2", "--max-restarts", "1",
                      "--parallelism.data_parallel_shard_degree=2", "--train.checkpoint_every=6",
                      "--train.steps=120", "--outer.heartbeat_s=0.2", "--outer.lease_s=3",
                      "--outer.round_timeout_s=120",
                      "--throttle", "3,3", "--kill", "island0.1@round2"},
                     dir.Join("local.log"));
  // The restarted island's rank 1, paused as soon as the service has the island back.
  std::string pid;
  for (int i = 0; i < 3000 && pid.empty(); ++i) {
    const std::string log = testing::ReadFile(dir.Join("run/island0.log"));
    const auto at = log.rfind("rank 1 of 2 started as pid ");
    if (at != std::string::npos && log.find("rank 1 of 2 started as pid ") != at) {
      pid = log.substr(at + 27, log.find('\n', at) - at - 27);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(pid.empty()) << testing::ReadFile(dir.Join("local.log"));
  for (int i = 0; i < 3000; ++i) {
    if (testing::ReadFile(dir.Join("run/coordinator.log")).find("island 'island0' joined at round") !=
        std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(kill(std::stoi(pid), SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  ASSERT_EQ(kill(std::stoi(pid), SIGCONT), 0);
  // Without agreement the run waits for the 120 s round deadline at least.
  EXPECT_EQ(local.Wait(90), 0) << testing::ReadFile(dir.Join("local.log"));
  EXPECT_GT(ExpectRangesMatchTheService(dir.Join("run")), 0);
  auto summary = nlohmann::json::parse(testing::ReadFile(dir.Join("run/island0/summary.json")));
  EXPECT_EQ(summary["step"], 120);
}

}  // namespace
}  // namespace atl
