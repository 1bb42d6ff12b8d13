#include "src/store/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "atoll/v1/checkpoint.pb.h"
#include "compression/checksum.h"
#include "src/cli/train_command.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;
using ::testing::HasSubstr;

inner::TrainerState SampleState() {
  inner::TrainerState s;
  s.step = 17;
  s.adam_step = 16;
  s.cursor = {2, 33};
  s.tensors = {{"model/a", torch::randn({15}), 0, {3, 5}},
               {"model/b", torch::arange(4, torch::kLong), 3, {7}},  // a rank's slice
               {"optim/exp_avg/a", torch::randn({15}).to(torch::kBFloat16), 0, {3, 5}},
               {"empty", torch::zeros({0}), 0, {0}}};
  s.rng_state = torch::randint(0, 255, {40}, torch::kByte);
  return s;
}

TEST(CheckpointTest, RoundTripIsBitExact) {
  TempDir dir;
  const auto s = SampleState();
  const std::string path = dir.Join("c.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, s, {12.5, "[train]\nsteps = 3\n"}).ok());
  auto r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state.step, 17);
  EXPECT_EQ(r->state.adam_step, 16);
  EXPECT_EQ(r->state.cursor, (inner::DataCursor{2, 33}));
  EXPECT_EQ(r->meta.wall_s, 12.5);
  EXPECT_EQ(r->meta.config_toml, "[train]\nsteps = 3\n");
  ASSERT_EQ(r->state.tensors.size(), s.tensors.size());
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    EXPECT_EQ(r->state.tensors[i].name, s.tensors[i].name);
    EXPECT_TRUE(torch::equal(r->state.tensors[i].values, s.tensors[i].values));
    EXPECT_EQ(r->state.tensors[i].offset, s.tensors[i].offset);
    EXPECT_EQ(r->state.tensors[i].shape, s.tensors[i].shape);
  }
  EXPECT_TRUE(torch::equal(r->state.rng_state, s.rng_state));
  // Nothing but the checkpoint is left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()), 1);
}

TEST(CheckpointTest, DamageIsDetectedNeverLoaded) {
  TempDir dir;
  const std::string path = dir.Join("c.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, SampleState(), {}).ok());
  const std::string good = testing::ReadFile(path);

  std::string flipped = good;
  flipped[flipped.size() - 190] ^= 1;  // inside the first tensor's bytes (the data region is 192)
  testing::WriteFile(path, flipped);
  auto r = ReadCheckpoint(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("checksum mismatch"));

  std::string header = good;
  header[30] ^= 1;
  testing::WriteFile(path, header);
  EXPECT_THAT(std::string(ReadCheckpoint(path).status().message()), HasSubstr("header checksum"));

  testing::WriteFile(path, good.substr(0, good.size() - 100));
  EXPECT_EQ(ReadCheckpoint(path).status().code(), absl::StatusCode::kDataLoss);

  testing::WriteFile(path, "definitely not a checkpoint");
  EXPECT_THAT(std::string(ReadCheckpoint(path).status().message()), HasSubstr("not an atoll"));
  EXPECT_EQ(ReadCheckpoint(dir.Join("missing")).status().code(), absl::StatusCode::kNotFound);
}

// Found by fuzz_checkpoint: a header with valid checksums (XXH64 is no secret) claiming a huge or
// negative shape made the reader allocate what it claimed (std::bad_alloc, an abort) before any
// size check. Now the shape must match the record's bytes inside the file first.
TEST(CheckpointTest, AHeaderCannotMakeTheReaderAllocateWhatTheFileDoesNotHold) {
  testing::TempDir dir;
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1 << 30, 1 << 30, 1 << 10}, std::vector<int64_t>{-4, 2},
        std::vector<int64_t>{int64_t(1) << 62, 4}}) {
    ::atollpb::v1::CheckpointHeader header;
    header.set_format_version(2);
    header.set_data_bytes(64);
    auto* t = header.add_tensors();
    t->set_name("model/w");
    t->set_dtype(::atollpb::v1::DTYPE_FLOAT32);
    for (int64_t d : shape) t->add_shape(d);
    t->set_num_bytes(64);
    const std::string bytes = header.SerializeAsString();
    std::string file = "ATOLLCK1";
    const uint64_t len = bytes.size(), sum = compression::Checksum(bytes.data(), bytes.size());
    file.append(reinterpret_cast<const char*>(&len), 8);
    file.append(reinterpret_cast<const char*>(&sum), 8);
    file += bytes;
    file.resize((file.size() + 63) / 64 * 64 + 64, '\0');
    testing::WriteFile(dir.Join("hostile.ckpt"), file);
    auto r = ReadCheckpoint(dir.Join("hostile.ckpt"));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("does not match its shape"));
  }
}

TEST(CheckpointTest, LatestAndPrune) {
  TempDir dir;
  std::filesystem::create_directories(dir.Join("checkpoints"));
  for (int step : {5, 40, 300}) {
    ASSERT_TRUE(WriteCheckpointShard(CheckpointPath(dir.path(), step), 0, 1, SampleState(), {}).ok());
  }
  EXPECT_EQ(*LatestCheckpoint(dir.path()), CheckpointPath(dir.path(), 300));
  // A checkpoint of two ranks counts once both files and the manifest are there.
  auto second = SampleState();
  second.step = 400;
  ASSERT_TRUE(WriteCheckpointShard(CheckpointPath(dir.path(), 400), 1, 2, second, {}).ok());
  EXPECT_EQ(*LatestCheckpoint(dir.path()), CheckpointPath(dir.path(), 300));
  ASSERT_TRUE(WriteCheckpointShard(CheckpointPath(dir.path(), 400), 0, 2, second, {}).ok());
  EXPECT_EQ(*LatestCheckpoint(dir.path()), CheckpointPath(dir.path(), 400));
  auto merged = ReadCheckpoint(CheckpointPath(dir.path(), 400));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->state.tensors.size(), 2 * second.tensors.size());
  EXPECT_EQ(merged->state.step, 400);
  PruneCheckpoints(dir.path(), 3);
  EXPECT_FALSE(std::filesystem::exists(CheckpointPath(dir.path(), 5)));
  EXPECT_TRUE(std::filesystem::exists(CheckpointPath(dir.path(), 40)));
  TempDir empty;
  EXPECT_EQ(LatestCheckpoint(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

std::vector<std::string> LossLines(const std::string& metrics) {
  std::vector<std::string> out;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    out.push_back(std::to_string(j["step"].get<int>()) + " " + j["loss"].dump() +
                  (j.contains("val_loss") ? " " + j["val_loss"].dump() : ""));
  }
  return out;
}

// Train 2k steps in one go == train k steps, stop, resume, train k more: bit for bit.
TEST(ResumeTest, ResumeIsBitIdentical) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 4));
  auto c = testing::TinyConfig(dir.Join("text.txt"));
  c.model.dropout = 0.1;
  c.train.steps = 24;
  c.train.eval_every = 5;
  c.train.checkpoint_every = 10;

  TrainOptions once;
  once.run_dir = dir.Join("once");
  once.progress = stdout;
  auto a = Train(c, once);
  ASSERT_TRUE(a.ok()) << a.status();

  TrainOptions split = once;
  split.run_dir = dir.Join("split");
  split.stop_after_step = 13;  // not on a checkpoint_every boundary
  auto b1 = Train(c, split);
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_TRUE(b1->stopped);
  EXPECT_EQ(b1->step, 13);
  split.stop_after_step = 0;
  split.resume = true;
  auto b2 = Train(c, split);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->step, 24);

  auto ca = ReadCheckpoint(CheckpointPath(once.run_dir, 24));
  auto cb = ReadCheckpoint(CheckpointPath(split.run_dir, 24));
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_EQ(ca->state.tensors.size(), cb->state.tensors.size());
  for (size_t i = 0; i < ca->state.tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(ca->state.tensors[i].values, cb->state.tensors[i].values))
        << ca->state.tensors[i].name;
  }
  EXPECT_EQ(ca->state.cursor, cb->state.cursor);
  EXPECT_EQ(a->last_eval->loss, b2->last_eval->loss);
  // The metrics log of the split run has each step once, with the same losses.
  EXPECT_EQ(LossLines(testing::ReadFile(once.run_dir + "/metrics.jsonl")),
            LossLines(testing::ReadFile(split.run_dir + "/metrics.jsonl")));
}

TEST(ResumeTest, ResumeDropsMetricsPastTheCheckpoint) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 4));
  auto c = testing::TinyConfig(dir.Join("text.txt"));
  c.train.steps = 12;
  c.train.checkpoint_every = 5;
  TrainOptions o;
  o.run_dir = dir.Join("run");
  o.progress = stdout;
  o.stop_after_step = 8;
  ASSERT_TRUE(Train(c, o).ok());
  // Simulate a crash after step 8: the newest checkpoint is step 5's.
  std::filesystem::remove_all(CheckpointPath(o.run_dir, 8));
  o.stop_after_step = 0;
  o.resume = true;
  auto r = Train(c, o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto lines = LossLines(testing::ReadFile(o.run_dir + "/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 12u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i].substr(0, lines[i].find(' ')), std::to_string(i + 1));
}

TEST(ResumeTest, RefusesToOverwriteOrResumeNothing) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 4));
  auto c = testing::TinyConfig(dir.Join("text.txt"));
  c.train.steps = 6;
  TrainOptions o;
  o.run_dir = dir.Join("run");
  o.progress = stdout;
  o.resume = true;
  EXPECT_EQ(Train(c, o).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(o.run_dir));
  o.resume = false;
  ASSERT_TRUE(Train(c, o).ok());
  EXPECT_EQ(Train(c, o).status().code(), absl::StatusCode::kAlreadyExists);
  // A checkpoint of another model shape is refused with the reason.
  auto other = c;
  other.model.d_model = 64;
  o.resume = true;
  auto r = Train(other, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does not fit this config"));
}

}  // namespace
}  // namespace atl
