// What a newcomer meets first: waits that say what they wait for, typos that name what was meant,
// paths that say what they were relative to, console lines a person can read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "inner/train_config.h"
#include "src/observe/metrics.h"
#include "tests/rank_util.h"
#include "tests/src/cli/cli_fixture.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::Atoll;

class NewcomerTest : public testing::CliTest {};

// An island pointed where nothing listens says where it is joining, what it waits for while it
// retries, and gives up within outer.reconnect_timeout_s naming the address and the cause (it
// used to print nothing for 60 s, then "Deadline Exceeded").
TEST_F(NewcomerTest, AnIslandWithNoCoordinatorSaysWhatItWaitsForAndGivesUp) {
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreePort());
  const auto start = std::chrono::steady_clock::now();
  auto r = testing::RunCommand("ATOLL_TOKEN=t " + std::string(ATOLL_BIN) + " island --name isl --coordinator " +
                               address + " --config " + dir_.Join("tiny.toml") + " --run-dir " +
                               dir_.Join("isl") + " --outer.reconnect_timeout_s=5");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("joining run 'atoll' at the coordinator at " + address));
  EXPECT_THAT(r.output, HasSubstr("still joining run 'atoll': no answer from the coordinator at " + address));
  EXPECT_THAT(r.output, HasSubstr("next try in"));
  EXPECT_THAT(r.output, HasSubstr("atoll: error: joining run 'atoll': not joined with the coordinator at " +
                                  address));
  EXPECT_THAT(r.output, HasSubstr("(outer.reconnect_timeout_s = 5)"));
  EXPECT_THAT(r.output, HasSubstr("connection refused: nothing listens on " + address));
  EXPECT_LT(took, 30) << "the join gave up late";  // 5 s of retries, not the 60 s call deadline
}

// Misspelt commands, flags, keys and values are named with what was probably meant.
TEST_F(NewcomerTest, TyposAreAnsweredWithTheNearestName) {
  const std::string local = "local --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("run") + " ";
  struct Case {
    std::string args;
    std::string message;
  } cases[] = {
      {"trian", "unknown command 'atoll trian' (did you mean 'atoll train'?); the commands are train, "},
      {"tokenizer trian", "unknown command 'atoll tokenizer trian' (did you mean 'atoll tokenizer train'?)"},
      {local + "--island 2", "unknown option '--island' of 'atoll local' (did you mean '--islands'?)"},
      {local + "--steps=3", "(did you mean '--train.steps'?)"},
      {local + "--train.sync_every=5", "unknown config key 'train.sync_every' (command line) (did you mean "
                                       "'--outer.sync_every'?)"},
      {"compare --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("run") +
           " --compare.methods=diloko",
       "unknown method 'diloko' (did you mean \"diloco\"?): the methods are baseline, diloco, "},
      {local + "--train.device=gpu", "got \"gpu\" (did you mean \"cpu\"?)"},
  };
  for (const auto& c : cases) {
    auto r = Atoll(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("atoll: error: ")) << c.args;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args << "\n" << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir_.Join("run"))) << c.args;
  }
}

// A relative path that names nothing says what it was relative to and how to fix it; a missing
// tokenizer gives the command that makes one.
TEST_F(NewcomerTest, AMissingRelativePathSaysWhereItWasLookedFor) {
  TempDir elsewhere;
  testing::WriteFile(dir_.Join("rel.toml"), "[data]\npath = \"data/brown/train.txt\"\n");
  auto r = testing::RunCommand("cd " + elsewhere.path() + " && " + ATOLL_BIN + " train --config " +
                               dir_.Join("rel.toml") + " --run-dir " + dir_.Join("run"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("data.path: no such file or directory: data/brown/train.txt, relative "
                                  "to the working directory " + elsewhere.path()));
  EXPECT_THAT(r.output, HasSubstr("or give data.path as an absolute path"));
  r = Atoll("train --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("run") +
            " --data.tokenizer=" + dir_.Join("tok.model") + " --model.vocab=300");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("to train one: atoll tokenizer train --input TEXT_FILES --vocab-size 300 "
                                  "--out " + dir_.Join("tok.model")));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("run")));
}

// A run's console: the warm start says why its rounds come fast, rounds are named by the ids
// rounds.jsonl and the islands use, no progress line reads 0.0k tok/s, and the islands print the
// global hash as the coordinator does (one per fragment).
TEST_F(NewcomerTest, ALocalRunsLinesAgreeWithEachOtherAndTheFiles) {
  auto r = Atoll("local --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("run") +
                 " --model.n_layer=2 --train.steps=8 --train.eval_every=0 --outer.sync_every=4"
                 " --outer.num_fragments=2"
                 " --outer.warm_start_steps=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the warm start's first 3 steps are rounds of one step each"));
  EXPECT_THAT(r.output, HasSubstr(" round 0 committed (1/10): island0+island1"));
  EXPECT_THAT(r.output, HasSubstr("] fragment 0 round 0 merged at step 1"));
  EXPECT_THAT(r.output, Not(HasSubstr("0.0k tok/s")));
  EXPECT_THAT(r.output, Not(HasSubstr("ETA ?")));
  const auto at = r.output.find("stopped after ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const auto hashes_at = r.output.find("global params ", at);
  ASSERT_NE(hashes_at, std::string::npos) << r.output;
  const std::string hashes = r.output.substr(hashes_at, r.output.find('\n', hashes_at) - hashes_at);
  EXPECT_EQ(hashes.size(), std::string("global params ").size() + 2 * 16 + 1) << hashes;  // two fragments
  EXPECT_THAT(r.output, HasSubstr("[island0] done at step 8 after"));
  for (const char* island : {"[island0] done", "[island1] done"}) {
    const auto line_at = r.output.find(island);
    ASSERT_NE(line_at, std::string::npos) << r.output;
    const std::string line = r.output.substr(line_at, r.output.find('\n', line_at) - line_at);
    EXPECT_THAT(line, ::testing::EndsWith(hashes)) << island;
  }
  // rounds.jsonl names the last round as the console did.
  const std::string rounds = testing::ReadFile(dir_.Join("run/coordinator/rounds.jsonl"));
  EXPECT_THAT(rounds, HasSubstr("\"round\":4"));
  EXPECT_THAT(r.output, HasSubstr("round 4 committed ("));
}

// "What the binary prints" quoted in the READMEs is what it prints: the planner's figures through
// atoll's star for a 1B model (outer/README.md, "Planning a run").
TEST(DocumentationTest, ThePlannersQuotedFiguresAreWhatItPrints) {
  const std::string readme = testing::ReadFile(ATOLL_SOURCE_DIR "/outer/README.md");
  const std::string plan = "plan --params 1e9 --step-time 0.1 --target-utilization 0.95 --latency 25ms "
                           "--connections 16";
  // The figure "X% at most" of a method's line.
  const auto reach = [](const std::string& output, const std::string& method) {
    const auto at = output.find(method + ": ");
    if (at == std::string::npos) return std::string("(no line for " + method + ")");
    const auto reaches = output.find("reaches ", at);
    return output.substr(reaches + 8, output.find(" at most", reaches) - reaches - 8);
  };
  auto one = Atoll(plan);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_THAT(readme, HasSubstr("four latencies cap it at " +
                                reach(one.output, "Streaming, H = 100, P = 8, tau = 1, fp4_e2m1")));
  auto eight = Atoll(plan + " --service-threads 8");
  ASSERT_EQ(eight.exit_code, 0) << eight.output;
  EXPECT_THAT(readme, HasSubstr("DiLoCo then reaches " + reach(eight.output, "DiLoCo, H = 100, bf16") +
                                " at most, Streaming FP4 with tau = 1 " +
                                reach(eight.output, "Streaming, H = 100, P = 8, tau = 1, fp4_e2m1")));
}

// `train --help` and the README agree on the device's default.
TEST(DocumentationTest, TheDeviceDefaultIsTheOneDocumented) {
  const std::string device = inner::TrainConfig().device;
  auto help = Atoll("train --help");
  EXPECT_THAT(help.output, HasSubstr("\"" + device + "\" (the default)"));
  EXPECT_THAT(testing::ReadFile(ATOLL_SOURCE_DIR "/inner/README.md"), HasSubstr("`" + device + "` (default)"));
}

// An island that waits for a round (here for a stalled peer, within its lease) says so every few
// seconds instead of going silent.
TEST_F(NewcomerTest, AnIslandWaitingForARoundSaysWhatItWaitsFor) {
  auto r = Atoll("local --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("run") +
                 " --train.steps=16 --train.eval_every=0 --outer.sync_every=4 --outer.heartbeat_s=0.2"
                 " --outer.lease_s=20 --throttle 10,10 --stop island1@round2:5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SIGSTOP to island1 for 5.0 s"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex(
                            "\\[island0\\] waiting [0-9]+ s for fragment 0's update from 127.0.0.1:[0-9]+ "
                            "\\(pushed at step [0-9]+; a sync round commits once every member's push has "
                            "arrived\\)"));
}

// The first progress line's rate is measured (it read "0.0k tok/s | ETA ?"): from when the
// steps began to the first log step.
TEST(ProgressTest, TheFirstLineHasARateAndAnEta) {
  TempDir dir;
  FILE* out = std::fopen(dir.Join("out.txt").c_str(), "w");
  ASSERT_NE(out, nullptr);
  Progress progress(out, /*tty=*/false, /*total_steps=*/100, /*log_every=*/50, "");
  progress.StartAt(10.0);  // a resumed run's earlier wall time
  inner::StepStats s;
  for (int64_t step = 1; step <= 50; ++step) {
    s.step = step;
    s.tokens = step * 1000;
    progress.OnStep(s, nullptr, 12.0);  // 50,000 tokens in 2 s
  }
  std::fclose(out);
  const std::string text = testing::ReadFile(dir.Join("out.txt"));
  EXPECT_THAT(text, HasSubstr("step 50/100 | loss"));
  EXPECT_THAT(text, HasSubstr("| 25.0k tok/s | ETA 2s"));
}

// The warm start's rounds (one per step, every fragment) print a line per interval, and the line
// shown says how many it stands for; other rounds always print.
TEST(RoundLinesTest, QuickRoundsPrintALinePerIntervalAndCountTheRest) {
  RoundLines lines(2.0);
  EXPECT_EQ(lines.Take(true, 0.0), std::optional<std::string>(""));
  EXPECT_EQ(lines.Take(true, 0.5), std::nullopt);
  EXPECT_EQ(lines.Take(true, 1.9), std::nullopt);
  EXPECT_EQ(lines.Take(true, 2.1), std::optional<std::string>(" (+2 warm-start rounds since the last line)"));
  EXPECT_EQ(lines.Take(true, 2.2), std::nullopt);
  EXPECT_EQ(lines.Take(false, 2.3), std::optional<std::string>(" (+1 warm-start rounds since the last line)"));
  EXPECT_EQ(lines.Take(false, 2.4), std::optional<std::string>(""));
}

}  // namespace
}  // namespace atl
