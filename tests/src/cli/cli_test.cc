// End-to-end tests of the `atoll` binary: exit codes, messages, and what it writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "inner/data.h"
#include "src/cli/chaos.h"
#include "tests/src/cli/cli_fixture.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;
using ::testing::HasSubstr;

using Result = testing::CommandResult;

using testing::Atoll;
using testing::CliTest;

TEST_F(CliTest, TrainsWritesMetricsAndResumes) {
  auto r = Atoll(Train("--train.steps=4"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("done at step 4"));
  EXPECT_THAT(r.output, HasSubstr("val_loss"));
  const std::string metrics = testing::ReadFile(dir_.Join("run/metrics.jsonl"));
  std::istringstream lines(metrics);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    auto j = nlohmann::json::parse(line);
    for (const char* key : {"step", "loss", "lr", "tokens", "wall_s"}) EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j.contains("val_loss"), j["step"] == 3 || j["step"] == 4) << line;
  }
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(std::filesystem::exists(dir_.Join("run/config.toml")));
  // Extending the run: resume to step 6.
  r = Atoll(Train("--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("resumed at step 4"));
  EXPECT_THAT(r.output, HasSubstr("done at step 6"));
}

TEST_F(CliTest, BadConfigGivesOneClearErrorAndWritesNothing) {
  struct Case {
    std::string args;
    std::string message;
  } cases[] = {
      {"--train.stepz=3", "unknown config key 'train.stepz'"},
      {"--train.steps=abc", "--train.steps: expected an integer"},
      {"--train.batch_size=-1", "train.batch_size must be positive"},
      {"--data.path=" + dir_.Join("missing.txt"), "missing.txt"},
      {"--data.path=" + dir_.Join("*.bin"), "no files match"},
      {"--resume", "--resume: no checkpoint"},
      {"stray", "unexpected argument 'stray'"},
      {"--outer.mode=fast", "outer.mode must be \"sync\" or \"async\""},
  };
  for (const auto& c : cases) {
    auto r = Atoll(Train(c.args));
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.output, HasSubstr("atoll: error: "));
    EXPECT_FALSE(RunDirExists()) << c.args;
  }
  auto r = Atoll("train --config " + dir_.Join("nope.toml") + " --run-dir " + dir_.Join("run"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("nope.toml"));
  EXPECT_FALSE(RunDirExists());
  r = Atoll("local --islands 2 --throttle 1,0.5 --config " + dir_.Join("tiny.toml") +
            " --run-dir " + dir_.Join("run"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--throttle factor '0.5' of island 1 is not a number >= 1"));
  EXPECT_FALSE(RunDirExists());
  // One island's own keys (a rehearsed hostile role): the island, the form and the key checked.
  for (const auto& [set, message] : std::vector<std::pair<std::string, std::string>>{
           {"island2:outer.fault=noise", "no island 'island2' in this run (island0 .. island1"},
           {"island1-outer.fault=noise", "expected ISLAND:KEY=VALUE"},
           {"island1:outer.fault=flip", "outer.fault must be \"none\", \"sign_flip\""}}) {
    r = Atoll("local --islands 2 --island-set " + set + " --config " + dir_.Join("tiny.toml") +
              " --run-dir " + dir_.Join("run"));
    EXPECT_EQ(r.exit_code, 2) << set;
    EXPECT_THAT(r.output, HasSubstr(message)) << set;
    EXPECT_FALSE(RunDirExists()) << set;
  }
}

TEST_F(CliTest, BadShardNamesTheFile) {
  std::vector<uint16_t> tokens(5000, 7);
  ASSERT_TRUE(inner::WriteShard(dir_.Join("good.bin"), tokens).ok());
  std::string bytes = testing::ReadFile(dir_.Join("good.bin"));
  bytes[0] = 'X';  // magic
  testing::WriteFile(dir_.Join("bad.bin"), bytes);
  auto r = Atoll(Train("--data.path=" + dir_.Join("bad.bin")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("data.path: shard " + dir_.Join("bad.bin") + ": bad magic"));
  EXPECT_FALSE(RunDirExists());
  r = Atoll(Train("--data.path=" + dir_.Join("good.bin") + " --model.vocab=8"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(CliTest, CoordinatorNeedsARunToken) {
  unsetenv("ATOLL_TOKEN");
  auto r = Atoll("coordinator --config " + dir_.Join("tiny.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("a run token is required"));
  r = Atoll("coordinator --config " + dir_.Join("tiny.toml") + " --token-file " +
            dir_.Join("missing.token"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("missing.token"));
}

// A coordinator that cannot listen prints why and exits 2 (it used to crash): a port another
// coordinator holds (never shared), an invalid port, swapped TLS files.
TEST_F(CliTest, CoordinatorStartUpErrorsExitTwoWithAReason) {
  setenv("ATOLL_TOKEN", "t0k3n", 1);
  testing::WriteFile(dir_.Join("twice.sh"), R"(
    "$1" coordinator --config "$2" --listen 127.0.0.1:0 > "$3" 2>&1 & pid=$!
    for i in $(seq 100); do grep -q listening "$3" && break; sleep 0.1; done
    port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$3")
    "$1" coordinator --config "$2" --listen "127.0.0.1:$port"
    code=$?
    kill $pid; wait $pid
    echo "second exit $code")");
  auto r = testing::RunCommand("bash " + dir_.Join("twice.sh") + " " + ATOLL_BIN + " " +
                               dir_.Join("tiny.toml") + " " + dir_.Join("first.log"));
  EXPECT_THAT(r.output, HasSubstr("second exit 2")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Address already in use")) << r.output;
  r = Atoll("coordinator --config " + dir_.Join("tiny.toml") + " --listen 127.0.0.1:70000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("the port must be a number from 0 to 65535"));
  r = Atoll("coordinator --config " + dir_.Join("tiny.toml") + " --http-listen nonsense");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--http-listen: listening address 'nonsense' must be HOST:PORT"));
  const auto made = testing::RunCommand(std::string(ATOLL_SOURCE_DIR) + "/deploy/make_certs.sh " +
                                        dir_.Join("certs") + " a");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  r = Atoll("coordinator --config " + dir_.Join("tiny.toml") + " --tls-cert " +
            dir_.Join("certs/coordinator.key") + " --tls-key " + dir_.Join("certs/coordinator.pem"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("swapped files?"));
  unsetenv("ATOLL_TOKEN");
}

// A robust rule that cannot act for the configured islands is refused at start (issue 36, gap 4):
// trimmed_mean at the default fraction trims floor(0.25 x 3) = 0 values with 3 islands, so it
// was the mean, silently; median with 2 islands is their mean (config_test: enough islands load).
TEST_F(CliTest, CoordinatorRefusesARobustRuleThatCannotAct) {
  setenv("ATOLL_TOKEN", "t0k3n", 1);
  const std::string coordinator = "coordinator --config " + dir_.Join("tiny.toml") +
                                  " --listen 127.0.0.1:0 --run-dir " + dir_.Join("coord") + " ";
  auto r = Atoll(coordinator + "--outer.aggregation=trimmed_mean --outer.islands=3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("trims floor(0.25 x 3) = 0 values at each end: it would be the "
                                  "mean. It needs at least 4 islands at this fraction"));
  r = Atoll(coordinator + "--outer.aggregation=median --outer.islands=2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("median cannot outvote a faulty island with outer.islands = 2"));
  unsetenv("ATOLL_TOKEN");
  // atoll local checks the M it starts (--islands), before starting anything.
  r = Atoll("local --islands 3 --config " + dir_.Join("tiny.toml") + " --run-dir " +
            dir_.Join("local") + " --outer.aggregation=trimmed_mean");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("outer.islands = 3 trims floor(0.25 x 3) = 0"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("local")));
}

// sparse_<codec>: SparseLoCo's settings on the config's run; its rows carry the bytes each way and
// the bits per parameter, a small fraction of fp32's, and pareto.svg has a dot per run.
TEST_F(CliTest, CompareRunsTheSparseMethodAndCountsItsBitsPerParameter) {
  // Runs a 4-step compare with `flags` and returns its report.csv rows by method.
  auto compare = [&](const std::string& dir, const std::string& flags) {
    std::map<std::string, std::vector<std::string>> rows;
    const auto r = Atoll("compare --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " +
                         dir_.Join(dir) + " --train.steps=4 --outer.sync_every=2" +
                         " --train.eval_every=4 " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return rows;
    std::istringstream lines(testing::ReadFile(dir_.Join(dir + "/report.csv")));
    std::string line;
    std::getline(lines, line);
    while (std::getline(lines, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ',');
      EXPECT_EQ(f.size(), 12u) << line;
      if (f.size() == 12u) rows[f[0]] = f;
    }
    return rows;
  };
  auto rows = compare("sparse", "--compare.methods=diloco_fp32,sparse_int2");
  ASSERT_EQ(rows.size(), 2u);
  const double fp32_up = std::stod(rows["diloco_fp32"][8]);
  const double sparse_up = std::stod(rows["sparse_int2"][8]);
  const double sparse_down = std::stod(rows["sparse_int2"][9]);
  EXPECT_GT(fp32_up, 32.0);  // 32 bits per parameter and the headers
  EXPECT_LT(fp32_up, 32.5);
  EXPECT_LT(sparse_up, 0.2);
  EXPECT_LT(sparse_down, 0.4);
  EXPECT_LT(std::stoull(rows["sparse_int2"][6]) * 100, std::stoull(rows["diloco_fp32"][6]));
  const std::string svg = testing::ReadFile(dir_.Join("sparse/pareto.svg"));
  int dots = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) ++dots;
  EXPECT_EQ(dots, 2);
  // A density given for the sparse method alone runs (the method turns error feedback on) and
  // sends about three times the bits of 1%.
  const auto three = compare("sparse3", "--compare.methods=sparse_int2 --outer.topk_density=0.03");
  ASSERT_EQ(three.size(), 1u);
  EXPECT_GT(std::stod(three.at("sparse_int2")[8]), 2 * sparse_up);
  EXPECT_LT(std::stod(three.at("sparse_int2")[8]), 4 * sparse_up);
}

TEST_F(CliTest, CompareWritesTheReport) {
  auto r = Atoll("compare --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " +
                 dir_.Join("cmp") + " --train.steps=4 --outer.sync_every=2 --train.eval_every=2" +
                 " --compare.methods=baseline,diloco,async --throttle 1,2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string csv = testing::ReadFile(dir_.Join("cmp/report.csv"));
  std::istringstream lines(csv);
  std::string header, baseline, diloco, async;
  std::getline(lines, header);
  std::getline(lines, baseline);
  std::getline(lines, diloco);
  std::getline(lines, async);
  EXPECT_EQ(header,
            "method,setting,val_loss,val_bpb,tokens,wan_bytes,bytes_up,bytes_down,bits_up,"
            "bits_down,wall_s,best");
  // The README quotes the header as written (a documentation check).
  EXPECT_THAT(testing::ReadFile(ATOLL_SOURCE_DIR "/src/README.md"), HasSubstr("(`" + header + "`;"));
  EXPECT_THAT(baseline, ::testing::StartsWith("baseline,,"));
  EXPECT_THAT(baseline, HasSubstr(",,,")) << "the baseline's bits per parameter are not measured";
  EXPECT_THAT(baseline, ::testing::Not(HasSubstr("nan")));
  EXPECT_THAT(diloco, ::testing::StartsWith("diloco,,"));
  EXPECT_THAT(diloco, ::testing::EndsWith(",1"));  // one run per method: each its best
  // Equal tokens: 4 steps x 2 sequences x 32 tokens x 2 islands.
  EXPECT_THAT(baseline, HasSubstr(",512,"));
  EXPECT_THAT(diloco, HasSubstr(",512,"));
  // Async islands train until the run's 512 tokens are spent, each finishing its last round.
  EXPECT_THAT(async, ::testing::StartsWith("async,"));
  EXPECT_THAT(testing::ReadFile(dir_.Join("cmp/report.md")), HasSubstr("Staleness"));
  EXPECT_THAT(testing::ReadFile(dir_.Join("cmp/report.md")), HasSubstr("| diloco |"));
  const std::string svg = testing::ReadFile(dir_.Join("cmp/loss.svg"));
  EXPECT_THAT(svg, HasSubstr("<polyline"));
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  // The same directory again is refused rather than overwritten.
  r = Atoll("compare --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " +
            dir_.Join("cmp"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("is not empty"));
}

TEST_F(CliTest, VersionSaysWhatTheBuildIs) {
  auto r = Atoll("--version");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, ::testing::StartsWith("atoll 0.1.0 (commit "));
  EXPECT_THAT(r.output, HasSubstr("libtorch "));
  EXPECT_THAT(r.output, HasSubstr("codec kernels: CPU"));
}

// Every run of a compare is checked before the first one starts: a method whose preset keys cannot
// apply to it says what it changes (async without the sync warm start), and a run that cannot
// start is refused before anything runs or is written.
TEST_F(CliTest, CompareChecksEveryRunBeforeTheFirstStarts) {
  const std::string base = "compare --islands 2 --config " + std::string(ATOLL_SOURCE_DIR) +
                           "/deploy/configs/tiny.toml --run-dir " + dir_.Join("cmp") +
                           " --data.path=" + dir_.Join("text.txt") + " --data.val_path= ";
  auto r = Atoll(base + "--throttle 1,3 --compare.methods=diloco,async --train.steps=300 "
                 "--outer.early_sync_every=10 --outer.early_sync_steps=100 --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("async runs with outer.early_sync_every = 0"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("outer.warm_start_steps = 0")));  // async warm-starts
  EXPECT_THAT(r.output, HasSubstr("dry run: nothing started"));
  // The plan and its cost, as a real run prints them first.
  EXPECT_THAT(r.output, HasSubstr("atoll compare: diloco x 1, async x 1 = 2 runs of 300 inner steps on 2 "
                                  "islands (1200 island-steps); 0 finished runs reused"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("cmp")));
  // Streaming's 4 fragments do not fit H = 2: refused before diloco has run.
  r = Atoll(base + "--compare.methods=diloco,streaming_fp4_e2m1 --outer.sync_every=2 "
            "--outer.warm_start_steps=0 --train.steps=300");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("compare: streaming_fp4_e2m1: outer.num_fragments must be in"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("cmp/diloco")));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("cmp/compare.json")));
  // A sparse density for the sparse method alone: it turns error feedback on itself, so only a
  // run without it (dense diloco at 3%) is refused, by name.
  r = Atoll(base + "--compare.methods=sparse_int2 --outer.topk_density=0.03 --dry-run");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Atoll(base + "--compare.methods=sparse_int2,diloco --outer.topk_density=0.03 --dry-run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("compare: diloco: outer.topk_density = 0.03"));
  EXPECT_THAT(r.output, HasSubstr("it needs outer.error_feedback = true"));
}

// `atoll report` gathers the runs of several compares into one report: each row's mean over the
// runs found under its directories, every run on the Pareto plot; a row without runs is refused.
TEST_F(CliTest, ReportGathersRunsIntoRows) {
  auto write = [&](const std::string& dir, double loss, uint64_t up) {
    std::filesystem::create_directories(dir_.Join(dir));
    testing::WriteFile(dir_.Join(dir + "/result.json"),
                       absl::StrCat("{\"method\":\"m\",\"setting\":\"\",\"val_loss\":", loss,
                                    ",\"tokens\":100,\"wan_bytes\":", 3 * up,
                                    ",\"bytes_up\":", up, ",\"bytes_down\":", 2 * up,
                                    ",\"bits_up\":0.5,\"bits_down\":1.0,\"wall_s\":1,"
                                    "\"note\":\"\",\"curve\":[[100,", loss, "]]}\n"));
  };
  write("a/s0/sparse_int2", 2.0, 1 << 20);
  write("a/s1/sparse_int2", 2.2, 1 << 20);
  write("b/diloco", 2.0, 100 << 20);
  auto r = Atoll("report --out " + dir_.Join("rep") + " --title t \"first=" + dir_.Join("b") +
                 "\" \"second=" + dir_.Join("a/s0") + "," + dir_.Join("a/s1") + "\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("| first | 1 | 2.0000 | 2.0000 / 2.0000 | +0.00% | 100.00 MiB / "
                                  "200.00 MiB | 0.500 / 1.000 |"));
  EXPECT_THAT(r.output, HasSubstr("| second | 2 | 2.1000 | 2.0000 / 2.2000 | +5.00% | 1.00 MiB / "
                                  "2.00 MiB | 0.500 / 1.000 |"));
  EXPECT_THAT(testing::ReadFile(dir_.Join("rep/pareto.svg")), HasSubstr("second"));
  r = Atoll("report --out " + dir_.Join("rep2") + " x=" + dir_.Join("nothing"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("row 'x': no result.json under"));
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("rep2")));
}

// Best-vs-best: every method runs the grid (the baseline only its non-outer part), each is reported
// at its best run, the whole grid is in report.csv, and the same command resumes a stopped sweep.
TEST_F(CliTest, CompareSweepsEachMethodReportsItsBestAndResumes) {
  const std::string command = "compare --islands 2 --config " + dir_.Join("tiny.toml") +
                              " --run-dir " + dir_.Join("sweep") +
                              " --train.steps=4 --outer.sync_every=2 --train.eval_every=4" +
                              " --sweep optim.lr=1e-3,1e-2 --sweep outer.lr=0.5,0.9";
  auto r = Atoll(command);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("baseline x 2, diloco x 4 = 6 runs of 4 inner steps on 2 islands "
                                  "(48 island-steps); 0 finished runs reused"));
  std::istringstream lines(testing::ReadFile(dir_.Join("sweep/report.csv")));
  std::string line;
  std::getline(lines, line);
  std::map<std::string, std::vector<std::pair<double, bool>>> by_method;  // (val_loss, best)
  int rows = 0;
  for (; std::getline(lines, line); ++rows) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_EQ(f.size(), 12u) << line;
    by_method[f[0]].emplace_back(std::stod(f[2]), f[11] == "1");
    EXPECT_NEAR(std::stod(f[3]), std::stod(f[2]) / std::log(2.0), 1e-5) << line;  // bytes: bits/byte
    EXPECT_EQ(f[4], "512") << line;  // equal tokens in every run
  }
  EXPECT_EQ(rows, 6);
  ASSERT_EQ(by_method["baseline"].size(), 2u);
  ASSERT_EQ(by_method["diloco"].size(), 4u);
  for (const auto& [method, runs] : by_method) {
    // Exactly one best per method, and it has the lowest loss.
    double lowest = 1e9, best = -1;
    int bests = 0;
    for (auto [loss, is_best] : runs) {
      lowest = std::min(lowest, loss);
      if (is_best) best = loss, ++bests;
    }
    EXPECT_EQ(bests, 1) << method;
    EXPECT_EQ(best, lowest) << method;
  }
  const std::string report = testing::ReadFile(dir_.Join("sweep/report.md"));
  EXPECT_THAT(report, HasSubstr("each method at its best setting"));
  EXPECT_THAT(report, HasSubstr("Every run of the sweep (6 runs"));
  EXPECT_THAT(report, HasSubstr("| diloco (optim.lr="));
  EXPECT_TRUE(std::filesystem::exists(dir_.Join("sweep/diloco/optim.lr=1e-2,outer.lr=0.9/result.json")));

  // A stopped sweep (here: one run's result lost) resumes: only that run trains again.
  std::filesystem::remove(dir_.Join("sweep/diloco/optim.lr=1e-3,outer.lr=0.5/result.json"));
  r = Atoll(command);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("5 finished runs reused"));
  EXPECT_THAT(r.output, HasSubstr("atoll compare: diloco, 2 islands"));  // the one run again
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("atoll compare: baseline, one island")));
  const std::string csv = testing::ReadFile(dir_.Join("sweep/report.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7);  // header + the whole grid again
  // Another grid in the same directory is refused; a bad sweep is named.
  r = Atoll(command + " --sweep optim.warmup_steps=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("holds another compare"));
  r = Atoll("compare --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("bad") +
            " --sweep optim.lr=fast");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--sweep optim.lr=fast"));
}

// A compare's report.csv as "method setting" -> (val_loss, tokens).
std::map<std::string, std::pair<double, int64_t>> CompareRuns(const std::string& csv) {
  std::map<std::string, std::pair<double, int64_t>> runs;
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    EXPECT_EQ(f.size(), 12u) << line;
    if (f.size() == 12) runs[f[0] + " " + f[1]] = {std::stod(f[2]), std::stoll(f[4])};
  }
  return runs;
}

// The gap report.md's gap table gives `method` at `x` (NAN when the row is missing).
double GapInReport(const std::string& report, const std::string& method, const std::string& x) {
  const std::string row = "| " + method + " | " + x + " | ";
  const size_t at = report.find(row);
  return at == std::string::npos ? NAN : std::stod(report.substr(at + row.size()));
}

// A sweep of one numeric key also reports and plots each method's gap to the baseline against
// the key's values (an outer.* key: against the baseline's one run).
TEST_F(CliTest, CompareSweepOfOneKeyPlotsTheGapToTheBaseline) {
  auto r = Atoll("compare --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " +
                 dir_.Join("gap") + " --train.steps=4 --train.eval_every=4" +
                 " --sweep outer.sync_every=2,4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("baseline x 1, diloco x 2 = 3 runs"));
  const auto runs = CompareRuns(testing::ReadFile(dir_.Join("gap/report.csv")));
  ASSERT_EQ(runs.size(), 3u);
  const std::string report = testing::ReadFile(dir_.Join("gap/report.md"));
  EXPECT_THAT(report, HasSubstr("## Gap to the baseline by outer.sync_every"));
  for (const std::string h : {"2", "4"}) {
    const double want =
        100.0 * (runs.at("diloco outer.sync_every=" + h).first / runs.at("baseline ").first - 1);
    EXPECT_NEAR(GapInReport(report, "diloco", h), want, 0.006) << "H = " << h;
  }
  const std::string svg = testing::ReadFile(dir_.Join("gap/gap.svg"));
  EXPECT_THAT(svg, HasSubstr(">outer.sync_every</text>"));
  int dots = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) ++dots;
  EXPECT_EQ(dots, 2);  // one per run of diloco
  EXPECT_THAT(r.output, HasSubstr("report.csv, loss.svg, pareto.svg, gap.svg, report.md"));
}

// With a second sweep, the gap is still plotted against the first key, one series per method
// and value of the second key, each against the baseline of its own setting (optim.lr changes
// the baseline: one baseline run per value).
TEST_F(CliTest, CompareSweepOfTwoKeysPlotsASeriesPerValueOfTheSecond) {
  auto r = Atoll("compare --islands 2 --config " + dir_.Join("tiny.toml") + " --run-dir " +
                 dir_.Join("gap2") + " --train.steps=4 --train.eval_every=4" +
                 " --compare.methods=baseline,diloco --sweep outer.sync_every=2,4" +
                 " --sweep optim.lr=1e-3,2e-3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("baseline x 2, diloco x 4 = 6 runs"));
  const auto runs = CompareRuns(testing::ReadFile(dir_.Join("gap2/report.csv")));
  const std::string report = testing::ReadFile(dir_.Join("gap2/report.md"));
  for (const std::string lr : {"1e-3", "2e-3"}) {
    for (const std::string h : {"2", "4"}) {
      const double want = 100.0 * (runs.at("diloco outer.sync_every=" + h + " optim.lr=" + lr).first /
                                       runs.at("baseline optim.lr=" + lr).first - 1);
      EXPECT_NEAR(GapInReport(report, "diloco, optim.lr=" + lr, h), want, 0.006) << lr << " " << h;
    }
  }
  const std::string svg = testing::ReadFile(dir_.Join("gap2/gap.svg"));
  EXPECT_THAT(svg, HasSubstr("diloco, optim.lr=2e-3"));
}

// Sweeping the island count M runs the baseline once per M too (its global batch is M x b): each
// M at equal tokens, each gap against the baseline of its own M.
TEST_F(CliTest, CompareSweepOfTheIslandCountRunsABaselinePerCount) {
  auto r = Atoll("compare --config " + dir_.Join("tiny.toml") + " --run-dir " + dir_.Join("m") +
                 " --train.steps=4 --outer.sync_every=2 --train.eval_every=4" +
                 " --sweep outer.islands=1,2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("baseline x 2, diloco x 2 = 4 runs of 4 inner steps on 2 islands "
                                  "(24 island-steps)"));
  const auto runs = CompareRuns(testing::ReadFile(dir_.Join("m/report.csv")));
  const std::string report = testing::ReadFile(dir_.Join("m/report.md"));
  for (int m : {1, 2}) {
    const std::string setting = " outer.islands=" + std::to_string(m);
    const auto& base = runs.at("baseline" + setting);
    const auto& diloco = runs.at("diloco" + setting);
    EXPECT_EQ(base.second, 256 * m);  // 4 steps x 2 sequences x 32 tokens x M
    EXPECT_EQ(diloco.second, 256 * m);
    EXPECT_NEAR(GapInReport(report, "diloco", std::to_string(m)),
                100.0 * (diloco.first / base.first - 1), 0.006) << "M = " << m;
  }
}

TEST_F(CliTest, PlanPrintsEachMethodsNeedsAndPlotsThem) {
  // The Streaming DiLoCo paper's setting (Table 4: 1B parameters, 0.1 s per step, 95%).
  auto r = Atoll("plan --params 1e9 --step-time 0.1 --target-utilization 0.95 --topology ring "
                 "--svg " + dir_.Join("plan.svg"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("| data parallel, bf16 gradients every step | 1.9 GiB |"));
  EXPECT_THAT(r.output, HasSubstr("222.5 Gbit/s |"));
  EXPECT_THAT(r.output, HasSubstr("| Streaming, H = 100, P = 8, tau = 1, fp4_e2m1 |"));
  // Sparse rounds at the config's H, and at the shorter H their quality needs.
  EXPECT_THAT(r.output, HasSubstr("| Streaming, H = 100, P = 8, tau = 1, top 1% of 4096, int2 |"));
  EXPECT_THAT(r.output,
              HasSubstr("| Streaming, H = 50, P = 8, tau = 1, top 1% of 4096, int2 (H / 2"));
  const std::string svg = testing::ReadFile(dir_.Join("plan.svg"));
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  EXPECT_THAT(svg, HasSubstr("<polyline"));

  // The config's outer.connections is the link's, unless --connections says otherwise.
  r = Atoll("plan --config " + dir_.Join("tiny.toml") + " --step-time 0.1 --bandwidth 1gbit "
            "--latency 50ms --outer.connections=4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("latency 50 ms, 4 TCP connection(s)"));
  r = Atoll("plan --config " + dir_.Join("tiny.toml") + " --step-time 0.1 --bandwidth 1gbit "
            "--latency 50ms --outer.connections=4 --connections 2");
  EXPECT_THAT(r.output, HasSubstr("latency 50 ms, 2 TCP connection(s)"));

  // A config's model (exact fragment sizes), one method, a finite run, as JSON.
  r = Atoll("plan --config " + dir_.Join("tiny.toml") + " --method streaming --fragments 1 "
            "--tau 2 --codec fp4_e2m1 --step-time 0.05 --bandwidth 10mbit --steps 6 "
            "--outer.sync_every=3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(0, r.output.find('\n')));
  EXPECT_EQ(j["method"], "streaming");
  EXPECT_EQ(j["tau"], 2);
  EXPECT_GT(j["utilization"].get<double>(), 0.0);
  EXPECT_LT(j["utilization"].get<double>(), 1.0);

  r = Atoll("plan --params 1e9 --step-time 0.1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--bandwidth"));
  r = Atoll("plan --params 1e9 --step-time 0.1 --bandwidth 1 furlong");
  EXPECT_EQ(r.exit_code, 2);
  r = Atoll("plan --params 1e9 --step-time 0.1 --bandwidth 1gbit --method gossip");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown method 'gossip'"));
  r = Atoll("plan --params 1e9 --step-time 0.1 --bandwidth 1gbit --tau 500");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("tau must be in [0, H = 100)"));
}

// --chaos: the spec's parts are checked by name; the failures are the same for the same seed,
// every island and kind is drawn, and the mean gap is the asked one.
TEST(ChaosSpecTest, ParsesChecksAndDrawsTheSameFailuresForTheSameSeed) {
  auto spec = ParseChaos("seed=7,every=30,kinds=kill+stop,down=12");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seed, 7u);
  EXPECT_EQ(spec->every_s, 30);
  EXPECT_EQ(spec->down_s, 12);
  EXPECT_EQ(spec->kinds.size(), 2u);
  EXPECT_TRUE(ParseChaos("").ok());  // every key optional
  EXPECT_EQ(ParseChaos("reference=runs/clean")->reference, "runs/clean");
  for (const char* bad : {"seed=x", "every=0", "down=inf", "kinds=kill+nap", "often=3", "seed",
                          "reference="}) {
    auto s = ParseChaos(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(std::string("'") + bad + "'"));
  }
  ChaosPlan a(*spec, 3), b(*spec, 3);
  spec->seed = 8;
  ChaosPlan c(*spec, 3);
  double last = 0;
  int kills = 0, islands[3] = {0, 0, 0};
  bool differs = false;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const auto fa = a.Next(), fb = b.Next(), fc = c.Next();
    EXPECT_EQ(fa.at_s, fb.at_s);
    EXPECT_EQ(fa.island, fb.island);
    EXPECT_EQ(fa.kind, fb.kind);
    differs |= fa.at_s != fc.at_s;
    EXPECT_GT(fa.at_s, last);
    last = fa.at_s;
    kills += fa.kind == ChaosKind::kKill;
    ++islands[fa.island];
  }
  EXPECT_TRUE(differs);
  EXPECT_NEAR(last / kDraws, 30, 1.5);  // exponential gaps: the mean within 5%
  EXPECT_NEAR(kills, kDraws / 2, kDraws / 20);
  for (int n : islands) EXPECT_NEAR(n, kDraws / 3, kDraws / 20);
}

// The report counts the tokens of rounds that changed the model (a zero update, progress false,
// counts none), gives the run's loss against a failure-free run's, and names a reference that
// holds none.
TEST(ChaosReportTest, CountsProgressAndComparesTheLossWithTheFailureFreeRun) {
  testing::TempDir dir;
  {
    std::ofstream rounds(dir.Join("rounds.jsonl"));
    rounds << R"({"round":0,"fragment":0,"contributors":["a","b"],"tokens":100})" << "\n"
           << R"({"round":1,"fragment":0,"contributors":["a","b"],"tokens":60,"progress":false})"
           << "\n"
           << R"({"round":2,"fragment":0,"contributors":["a"],"tokens":50})" << "\n";
  }
  std::filesystem::create_directories(dir.Join("run/island0"));  // its first process's
  std::filesystem::create_directories(dir.Join("run/island0.2"));  // its restarts'
  std::filesystem::create_directories(dir.Join("run/island0.10"));
  std::filesystem::create_directories(dir.Join("clean/island0"));
  std::ofstream(dir.Join("run/island0/summary.json")) << R"({"val_loss": 9.0})";
  std::ofstream(dir.Join("run/island0.2/summary.json")) << R"({"val_loss": 8.0})";
  std::ofstream(dir.Join("run/island0.10/summary.json")) << R"({"val_loss": 2.5})";
  std::ofstream(dir.Join("clean/island0/summary.json")) << R"({"val_loss": 2.0})";
  Chaos chaos(*ParseChaos("reference=" + dir.Join("clean")), 2);
  auto report = chaos.Report(dir.Join("rounds.jsonl"), 200, dir.Join("run"));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->tokens_committed, 150u);
  EXPECT_EQ(report->rounds_short, 1u);
  EXPECT_DOUBLE_EQ(report->goodput(), 0.75);
  EXPECT_DOUBLE_EQ(report->loss_change(), 0.25);
  EXPECT_THAT(report->Text(), HasSubstr("val_loss 2.5000 (+25.00% against the failure-free run's 2.0000)"));
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(report->Json())["loss_change"].get<double>(), 0.25);
  Chaos missing(*ParseChaos("reference=" + dir.Join("nowhere")), 2);
  auto refused = missing.Report(dir.Join("rounds.jsonl"), 200, dir.Join("run"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no island0/summary.json"));
}

}  // namespace
}  // namespace atl
