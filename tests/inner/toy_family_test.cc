// A family that atoll does not ship, added as a user would (tests/inner/toy_family.{h,cc}, then
// inner::RegisterFamily: the table's row), runs through the code that asks the family table: the
// config's checks, the parallelisms (its plan is all they see), checkpoints, the model's hash and
// its files' metadata, and the refusal of a Hugging Face export it has no mapping for.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "inner/model.h"
#include "inner/trainer.h"
#include "src/store/checkpoint.h"
#include "src/store/flat_params.h"
#include "src/store/hf_format.h"
#include "src/store/model_io.h"
#include "tests/inner/parity_util.h"
#include "tests/inner/toy_family.h"
#include "tests/test_util.h"

namespace atl::testing {
namespace {

using ::testing::HasSubstr;

class ToyFamilyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    toy::Register();
    WriteFile(dir_.Join("text.txt"), GeneratedText(80000, 21));
  }
  Config Toy() const {
    auto c = TinyConfig(dir_.Join("text.txt"));
    c.model.arch = "toy";
    c.model.n_layer = 3;
    c.train.batch_size = 2;
    c.train.steps = 20;
    return c;
  }
  TempDir dir_;
};

TEST_F(ToyFamilyTest, TheConfigKnowsItAndRefusesOtherFamiliesKeys) {
  auto c = Toy();
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  c.model.n_kv_head = 1;  // Llama's
  EXPECT_THAT(std::string(Validate(c).message()), HasSubstr("model.n_kv_head applies to model.arch = \"llama\" only"));
  c = Toy();
  c.model.arch = "toys";
  EXPECT_THAT(std::string(Validate(c).message()),
              HasSubstr("model.arch must be \"gpt2\", \"llama\" or \"toy\", got \"toys\""));
}

TEST_F(ToyFamilyTest, ItsModuleHasTheShapesItsRowSays) {
  const auto c = Toy().model;
  auto model = inner::BuildModel(c);
  const auto params = inner::NamedParameters(*model);
  const auto shapes = inner::ParameterShapes(c);
  ASSERT_EQ(params.size(), shapes.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, shapes[i].first);
    EXPECT_EQ(params[i].second.sizes().vec(), shapes[i].second) << shapes[i].first;
  }
  EXPECT_EQ(inner::FragmentGroups(inner::PlanOf(c), {"embed.weight", "layers.2.fc.weight", "head.weight"}),
            (std::vector<int>{0, 2, 2}));
  EXPECT_NE(ModelConfigHash(c), ModelConfigHash(TinyConfig("").model));
}

// The parallelisms apply its plan and know nothing else of it: FSDP 2 and TP 2 ranks equal one
// rank on the same global batch.
TEST_F(ToyFamilyTest, ShardsAndTensorParallelRanksEqualOneRank) {
  auto c = Toy();
  auto reference = c;
  reference.train.grad_accum = 2;
  const auto two = TrainIsland(reference, 1, {}, dir_, "toy-reference2");
  ExpectParity(TrainIsland(c, 2, Mesh(2), dir_, "toy-fsdp2"), two, "toy fsdp 2 vs 1 rank");
  const auto one = TrainIsland(c, 1, {}, dir_, "toy-reference1");
  ExpectParity(TrainIsland(c, 2, Mesh(1, 2), dir_, "toy-tp2"), one, "toy tp 2 vs 1 rank");
  EXPECT_LT(one.losses.back(), one.losses.front());
}

// Its checkpoints and atoll-named safetensors read back as the same model; a Hugging Face export
// is refused by name (it has no mapping).
TEST_F(ToyFamilyTest, ItsWeightsGoThroughFilesAndRefuseHuggingFace) {
  const auto c = Toy();
  auto data = inner::LoadDataset(c.data, c.model.context, c.model.vocab);
  ASSERT_TRUE(data.ok()) << data.status();
  auto trainer = inner::Trainer::Create(c.trainer(), *data);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*trainer)->Step().ok());
  const std::string checkpoint = dir_.Join("toy-ckpt");
  ASSERT_TRUE(WriteCheckpointShard(checkpoint, 0, 1, (*trainer)->ExportState(), {0, ToToml(c)}).ok());
  auto from_checkpoint = LoadWeights(checkpoint, nullptr);  // its config names the family
  ASSERT_TRUE(from_checkpoint.ok()) << from_checkpoint.status();
  EXPECT_EQ(from_checkpoint->model.arch, "toy");
  const auto live = inner::NamedParameters(*(*trainer)->model());
  ASSERT_EQ(from_checkpoint->params.size(), live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(from_checkpoint->params[i].first, live[i].first);
    EXPECT_TRUE(torch::equal(from_checkpoint->params[i].second, live[i].second)) << live[i].first;
  }

  const std::string file = dir_.Join("toy.safetensors");
  ASSERT_TRUE(WriteSafetensors(*from_checkpoint, file, NameStyle::kAtoll).ok());
  auto back = LoadWeights(file, nullptr);  // its metadata names the family
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->model.arch, "toy");
  EXPECT_TRUE(CheckSameArchitecture(c.model, back->model, "the file").ok());
  for (size_t i = 0; i < back->params.size(); ++i) {
    EXPECT_TRUE(torch::equal(back->params[i].second, from_checkpoint->params[i].second));
  }

  const auto hf = WriteSafetensors(*from_checkpoint, dir_.Join("hf.safetensors"), NameStyle::kHf);
  EXPECT_EQ(hf.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(hf.message()), HasSubstr("model family \"toy\" has no Hugging Face names"));
  const auto dir = hf::Write(*from_checkpoint, dir_.Join("hf"), {});
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr("has no Hugging Face mapping"));
}

}  // namespace
}  // namespace atl::testing
