#include "src/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "compression/config_value.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;
using ::testing::HasSubstr;

absl::Status LoadText(const std::string& toml, std::vector<Override> overrides = {}) {
  TempDir dir;
  testing::WriteFile(dir.Join("c.toml"), toml);
  return LoadConfig(dir.Join("c.toml"), overrides).status();
}

TEST(ConfigTest, EveryPresetLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(ATOLL_SOURCE_DIR "/deploy/configs")) {
    if (e.path().extension() != ".toml") continue;
    auto c = LoadConfig(e.path().string(), {});
    EXPECT_TRUE(c.ok()) << e.path() << ": " << c.status();
    ++n;
  }
  EXPECT_GE(n, 2);
}

TEST(ConfigTest, FileThenOverrides) {
  TempDir dir;
  testing::WriteFile(dir.Join("c.toml"),
                     "[data]\npath = \"x.txt\"\n[train]\nsteps = 50\nbatch_size = 3\n"
                     "[optim]\nlr = 1\nwarmup_steps = 0\n");
  auto c = LoadConfig(dir.Join("c.toml"), {{"train.steps", "200"}, {"optim.lr", "0.5"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->train.steps, 200);
  EXPECT_EQ(c->train.batch_size, 3);
  EXPECT_EQ(c->optim.lr, 0.5);
  EXPECT_EQ(c->data.path, "x.txt");
}

TEST(ConfigTest, ResolvedTomlRoundTrips) {
  auto c = LoadConfig("", {{"data.path", "a b.txt"}, {"model.dropout", "0.25"},
                           {"train.device", "cpu"}, {"data.seed", "77"}});
  ASSERT_TRUE(c.ok()) << c.status();
  TempDir dir;
  testing::WriteFile(dir.Join("r.toml"), ToToml(*c));
  auto again = LoadConfig(dir.Join("r.toml"), {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ToToml(*again), ToToml(*c));
  EXPECT_EQ(again->data.path, "a b.txt");
  EXPECT_EQ(again->model.dropout, 0.25);
  EXPECT_EQ(again->data.seed, 77u);
}

// Written configs (run directories, `atoll import`) hold numbers as a person writes them, and
// every double still reads back exactly.
TEST(ConfigTest, WrittenNumbersAreTheShortestThatReadBack) {
  auto c = LoadConfig("", {{"data.path", "x.txt"}, {"optim.lr", "0.1"}, {"optim.weight_decay", "1e-300"},
                           {"model.dropout", "0.30000000000000004"}});
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string text = ToToml(*c);
  EXPECT_THAT(text, HasSubstr("\nbeta1 = 0.9\n"));
  EXPECT_THAT(text, HasSubstr("\nlr = 0.1\n"));
  EXPECT_THAT(text, HasSubstr("\nweight_decay = 1e-300\n"));
  EXPECT_THAT(text, HasSubstr("\ndropout = 0.30000000000000004\n"));  // 17 digits where needed
  EXPECT_THAT(text, HasSubstr("\nrope_theta = 10000.0\n"));           // still a TOML float
  EXPECT_THAT(text, ::testing::Not(HasSubstr("0000000000000002")));
  auto again = ParseConfig(text, "written");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->optim.adamw.beta1, 0.9);
  EXPECT_EQ(again->model.dropout, 0.30000000000000004);
  EXPECT_EQ(again->optim.adamw.weight_decay, 1e-300);
  EXPECT_EQ(ToToml(*again), text);
}

// A misspelt key or value names what was probably meant.
TEST(ConfigTest, TyposNameTheNearestKeyOrValue) {
  struct Case {
    std::vector<Override> overrides;
    std::string message;
  } cases[] = {
      {{{"train.stepz", "3"}}, "unknown config key 'train.stepz' (command line) (did you mean 'train.steps'?)"},
      {{{"train.sync_every", "3"}}, "(did you mean 'outer.sync_every'?)"},  // across sections
      {{{"outer.mode", "aync"}}, "outer.mode must be \"sync\" or \"async\", got \"aync\" (did you mean \"async\"?)"},
      {{{"outer.codec", "fp4"}}, "unknown codec 'fp4' (did you mean \"fp4_e2m1\"?)"},
      {{{"model.arch", "lama"}}, "(did you mean \"llama\"?)"},
      {{{"optim.name", "muno"}}, "optim.name must be \"adamw\" or \"muon\", got \"muno\" (did you mean \"muon\"?)"},
  };
  for (const auto& c : cases) {
    auto s = LoadConfig("", c.overrides).status();
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.overrides[0].first;
  }
  // Nothing near: no guess.
  auto s = LoadConfig("", {{"train.zzzzzzzz", "3"}}).status();
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("did you mean")));
  EXPECT_EQ(NearestName("trian", {"train", "tokenize"}), "train");
  EXPECT_EQ(NearestName("steps", {"islands", "train.steps"}), "train.steps");
  EXPECT_EQ(NearestName("xyz", {"train", "tokenize"}), "");
}

// A config refused: its TOML and overrides, the status, a text the message holds.
struct ErrorCase {
  std::string toml;
  std::vector<Override> overrides;
  absl::StatusCode code;
  std::string message;
};

void ExpectErrors(const std::vector<ErrorCase>& cases) {
  for (const auto& c : cases) {
    auto s = LoadText(c.toml, c.overrides);
    EXPECT_EQ(s.code(), c.code) << c.toml << " -> " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.toml;
  }
}

const char kBase[] = "[data]\npath = \"x\"\n";

// Keys, types, ranges and syntax in the file.
TEST(ConfigTest, ErrorsNameTheKeyOrFile) {
  const std::string base = kBase;
  ExpectErrors({
      {base + "[train]\nstepz = 3\n", {}, absl::StatusCode::kInvalidArgument,
       "unknown config key 'train.stepz'"},
      {base + "[train]\nsteps = \"many\"\n", {}, absl::StatusCode::kInvalidArgument,
       "'train.steps' in "},
      {base + "[train]\nsteps = 1.5\n", {}, absl::StatusCode::kInvalidArgument,
       "must be an integer"},
      {base + "[model]\nn_layer = 99999999999\n", {}, absl::StatusCode::kOutOfRange,
       "'model.n_layer'"},
      {"[data]\npath = \"x\"\nseed = -1\n", {}, absl::StatusCode::kInvalidArgument,
       "'data.seed'"},
      {base + "[optim]\nlr = \"fast\"\n", {}, absl::StatusCode::kInvalidArgument,
       "must be a number"},
      {base + "[train]\nsteps = 0\n", {}, absl::StatusCode::kInvalidArgument, "train.steps"},
      {base + "[model]\nd_model = 100\nn_head = 3\n", {}, absl::StatusCode::kInvalidArgument,
       "model.n_head"},
      {base + "[optim]\nbeta2 = 1.0\n", {}, absl::StatusCode::kInvalidArgument, "optim.beta2"},
      {base + "[train]\ndevice = \"tpu\"\n", {}, absl::StatusCode::kInvalidArgument,
       "train.device"},
      {"[model\nn_layer = 2\n", {}, absl::StatusCode::kInvalidArgument, "c.toml:1:"},
      {"[train]\nsteps = 3\n", {}, absl::StatusCode::kInvalidArgument, "data.path is required"},
  });
  auto missing = LoadConfig("/nonexistent/c.toml", {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/c.toml"));
}

// Command-line overrides and the [outer] section's rules.
TEST(ConfigTest, OverridesAndOuterErrorsNameTheKey) {
  const std::string base = kBase;
  ExpectErrors({
      {base, {{"train.stepz", "3"}}, absl::StatusCode::kInvalidArgument,
       "unknown config key 'train.stepz' (command line)"},
      {base, {{"train.steps", "ten"}}, absl::StatusCode::kInvalidArgument,
       "--train.steps: expected an integer"},
      {base, {{"model.n_layer", "3000000000"}}, absl::StatusCode::kInvalidArgument,
       "--model.n_layer"},
      {base, {{"outer.aggregation", "mode"}}, absl::StatusCode::kInvalidArgument,
       "unknown aggregation 'mode'"},
      {base, {{"outer.trim_fraction", "0.5"}}, absl::StatusCode::kInvalidArgument,
       "outer.trim_fraction"},
      {base, {{"outer.aggregation", "trimmed_mean"}, {"outer.islands", "3"}},
       absl::StatusCode::kInvalidArgument, "trims floor(0.25 x 3) = 0 values at each end"},
      {base, {{"outer.aggregation", "clipped_mean"}, {"outer.islands", "2"}},
       absl::StatusCode::kInvalidArgument, "clipped_mean cannot outvote a faulty island"},
      {base, {{"outer.max_update_norm", "-1"}}, absl::StatusCode::kInvalidArgument,
       "outer.max_update_norm"},
      {base, {{"outer.run_id", "a b"}}, absl::StatusCode::kInvalidArgument, "outer.run_id 'a b'"},
      {base, {{"outer.service_threads", "-1"}}, absl::StatusCode::kInvalidArgument,
       "outer.service_threads must be in 0..256 (0: the cores the service may use), got -1"},
      {base, {{"outer.connections", "65"}}, absl::StatusCode::kInvalidArgument,
       "outer.connections must be in 1..64, got 65"},
      {base, {{"outer.optimizer", "adam"}}, absl::StatusCode::kInvalidArgument,
       "outer.optimizer must be one of nesterov, sgd, got \"adam\""},
      {base, {{"outer.codec", "fp5"}}, absl::StatusCode::kInvalidArgument,
       "outer.codec: unknown codec 'fp5'"},
      {base, {{"outer.lr_decay", "linear"}}, absl::StatusCode::kInvalidArgument,
       "outer.lr_decay must be \"constant\" or \"cosine\", got \"linear\""},
      {base, {{"outer.warm_start_steps", "-5"}}, absl::StatusCode::kInvalidArgument,
       "outer.warm_start_steps must be >= 0, got -5"},
      {base, {{"outer.mode", "async"}, {"outer.early_sync_every", "5"}, {"outer.early_sync_steps", "10"}},
       absl::StatusCode::kInvalidArgument, "async islands choose their own H"},
      {base, {{"outer.early_sync_every", "5"}, {"outer.early_sync_steps", "12"}},
       absl::StatusCode::kInvalidArgument, "must be a multiple of outer.early_sync_every (5)"},
      {base, {{"outer.scoring", "loss"}}, absl::StatusCode::kInvalidArgument,
       "outer.scoring must be \"off\" or \"loss_probe\", got \"loss\""},
      {base, {{"outer.fault", "flip"}}, absl::StatusCode::kInvalidArgument,
       "outer.fault must be \"none\", \"sign_flip\", \"noise\" or \"copy\", got \"flip\""},
      {base, {{"outer.fault", "copy"}, {"outer.fault_rounds", "3"}},
       absl::StatusCode::kInvalidArgument, "a copier copies for the whole run"},
      {base, {{"outer.scoring", "loss_probe"}, {"outer.mode", "async"}},
       absl::StatusCode::kInvalidArgument, "async mode and outer.shards > 1 are not supported"},
      {base, {{"outer.exclude_below", "0.6"}}, absl::StatusCode::kInvalidArgument,
       "outer.exclude_below must be in [0, outer.reputation_floor)"},
      {base, {{"outer.reputation_decay", "1"}}, absl::StatusCode::kInvalidArgument,
       "outer.reputation_decay must be in [0, 1), got 1"},
      {base, {{"outer.leave_one_out_t", "8"}}, absl::StatusCode::kInvalidArgument,
       "outer.leave_one_out_t must be in [0, 8)"},
      {base, {{"outer.leave_one_out_t", "-1"}}, absl::StatusCode::kInvalidArgument,
       "outer.leave_one_out_t must be in [0, 8)"},
      {base, {{"outer.step_guard", "-0.1"}}, absl::StatusCode::kInvalidArgument,
       "outer.step_guard must be in [0, 10]"},
  });
  // Async runs take a warm start (each island pushes every one of its first steps) and outer-lr
  // schedules (over the run's progress).
  EXPECT_TRUE(LoadText(base, {{"outer.mode", "async"}, {"outer.warm_start_steps", "10"}}).ok());
  EXPECT_TRUE(LoadText(base, {{"outer.mode", "async"}, {"outer.lr_decay", "cosine"},
                              {"outer.lr_warmup_rounds", "2"}}).ok());
  // Each robust rule loads from the smallest island count it acts on (outer/base/aggregation.h).
  for (const auto& [rule, islands] : std::vector<std::pair<std::string, std::string>>{
           {"trimmed_mean", "4"}, {"median", "3"}, {"clipped_mean", "3"}, {"mean", "1"}}) {
    EXPECT_TRUE(LoadText(base, {{"outer.aggregation", rule}, {"outer.islands", islands}}).ok())
        << rule << " with " << islands << " islands";
  }
}

// Parallelism and precision: what each degree needs of the model and the batch.
TEST(ConfigTest, ParallelismErrorsNameWhatTheyNeed) {
  const std::string base = kBase;
  ExpectErrors({
      {base + "[model]\nd_model = 96\nn_head = 6\n", {{"parallelism.tensor_parallel_degree", "4"}},
       absl::StatusCode::kInvalidArgument,
       "parallelism.tensor_parallel_degree = 4 must divide model.n_head (6)"},
      {base + "[model]\ncontext = 30\n",
       {{"parallelism.tensor_parallel_degree", "4"}, {"parallelism.enable_sequence_parallel", "true"}},
       absl::StatusCode::kInvalidArgument,
       "enable_sequence_parallel needs model.context (30) to divide by "
       "parallelism.tensor_parallel_degree = 4"},
      {base + "[model]\nn_layer = 3\n", {{"parallelism.pipeline_parallel_degree", "4"}},
       absl::StatusCode::kInvalidArgument,
       "pipeline_parallel_degree = 4 needs at least one block per stage: model.n_layer = 3"},
      {base, {{"parallelism.pipeline_parallel_microbatches", "3"}, {"train.batch_size", "8"}},
       absl::StatusCode::kInvalidArgument,
       "pipeline_parallel_microbatches must be positive and divide train.batch_size = 8, got 3"},
      {base, {{"parallelism.pipeline_parallel_schedule", "interleaved"}},
       absl::StatusCode::kInvalidArgument,
       "pipeline_parallel_schedule must be \"GPipe\" or \"1F1B\", got \"interleaved\""},
      {base, {{"train.mixed_precision", "fp16"}}, absl::StatusCode::kInvalidArgument,
       "train.mixed_precision must be \"none\" or \"bf16\", got \"fp16\""},
  });
}

// Each case's overrides of `base` are refused as INVALID_ARGUMENT with a message holding its text.
template <size_t N>
void ExpectRefused(const std::string& base,
                   const std::pair<std::vector<Override>, std::string> (&cases)[N]) {
  for (const auto& [overrides, message] : cases) {
    auto s = LoadText(base, overrides);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(message));
  }
}

// Sparse pseudo-gradients: each key's range, and what they need or cannot work with, by name.
TEST(ConfigTest, SparseKeysAreCheckedByName) {
  const std::string base = "[data]\npath = \"x\"\n";
  const std::pair<std::vector<Override>, std::string> cases[] = {
      {{{"outer.topk_density", "0"}}, "outer.topk_density must be in (0, 1], got 0"},
      {{{"outer.topk_chunk", "100"}}, "outer.topk_chunk must be a multiple of 32 in 32..4096, got 100"},
      {{{"outer.error_feedback_decay", "1.5"}}, "outer.error_feedback_decay must be in [0, 1]"},
      {{{"outer.topk_density", "0.01"}}, "it needs outer.error_feedback = true"},
      {{{"outer.topk_density", "0.01"}, {"outer.error_feedback", "true"},
        {"outer.aggregation", "median"}, {"outer.islands", "3"}},
       "outer.aggregation = median works per coordinate"},
  };
  ExpectRefused(base, cases);
  auto sparse = LoadText(base, {{"outer.topk_density", "0.01"}, {"outer.error_feedback", "true"},
                                {"outer.codec", "int2"}});
  EXPECT_TRUE(sparse.ok()) << sparse;
  // The sparse codecs have device kernels: their pseudo-gradients may be made on the GPU.
  auto on_device = LoadText(base, {{"outer.topk_density", "0.01"}, {"outer.error_feedback", "true"},
                                   {"outer.codec", "int2"}, {"outer.global_copy", "device"}});
  EXPECT_TRUE(on_device.ok()) << on_device;
}

// Eager updates: what they need (rounds in flight, sync mode, host copies), by name.
TEST(ConfigTest, EagerUpdatesAreCheckedByName) {
  const std::string base = "[data]\npath = \"x\"\n";
  const std::pair<std::vector<Override>, std::string> cases[] = {
      {{{"outer.eager_updates", "true"}}, "it needs outer.fragment_sync_delay > 0"},
      {{{"outer.eager_updates", "true"}, {"outer.fragment_sync_delay", "2"}, {"outer.mode", "async"}},
       "outer.eager_updates = true is for sync rounds"},
      {{{"outer.eager_updates", "true"}, {"outer.fragment_sync_delay", "2"},
        {"outer.global_copy", "device"}},
       "makes its stand-ins on the host"},
  };
  ExpectRefused(base, cases);
  EXPECT_TRUE(LoadText(base, {{"outer.eager_updates", "true"}, {"outer.fragment_sync_delay", "2"}}).ok());
}

TEST(ConfigTest, ParseOverrides) {
  auto o = ParseOverrides({"--train.steps=200", "--data.path", "f.txt", "--optim.lr=1e-3"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(*o, (std::vector<Override>{{"train.steps", "200"}, {"data.path", "f.txt"},
                                       {"optim.lr", "1e-3"}}));
  EXPECT_THAT(std::string(ParseOverrides({"stray"}).status().message()), HasSubstr("'stray'"));
  EXPECT_THAT(std::string(ParseOverrides({"--train.steps"}).status().message()),
              HasSubstr("needs a value"));
}

}  // namespace
}  // namespace atl
