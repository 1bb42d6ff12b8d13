#include "inner/model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "inner/parallel/tensor_parallel.h"

namespace atl::inner {
namespace {

ModelConfig Small() {
  ModelConfig c;
  c.n_layer = 3;
  c.d_model = 48;
  c.n_head = 4;
  c.context = 16;
  c.vocab = 100;
  return c;
}

TEST(ModelTest, ParameterCountMatchesClosedFormAndGpt2Small) {
  auto c = Small();
  const CausalLm model = BuildModel(c);
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, ParameterCount(c));
  // GPT-2 small with an untied head: 124,439,808 + 768 * 50257.
  ModelConfig gpt2{"gpt2", 12, 768, 12, 1024, 50257};
  EXPECT_EQ(ParameterCount(gpt2), 124439808 + 768LL * 50257);
}

TEST(ModelTest, StableNamesAndShapes) {
  auto c = Small();
  const CausalLm model = BuildModel(c);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, p] : NamedParameters(*model)) shapes[name] = p.sizes().vec();
  EXPECT_EQ(shapes.size(), size_t(2 + 12 * c.n_layer + 3));
  EXPECT_EQ(shapes["tok_emb.weight"], (std::vector<int64_t>{100, 48}));
  EXPECT_EQ(shapes["pos_emb.weight"], (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(shapes["blocks.2.attn.qkv.weight"], (std::vector<int64_t>{144, 48}));
  EXPECT_EQ(shapes["blocks.2.attn.qkv.bias"], (std::vector<int64_t>{144}));
  EXPECT_EQ(shapes["blocks.0.attn.proj.weight"], (std::vector<int64_t>{48, 48}));
  EXPECT_EQ(shapes["blocks.1.mlp.fc.weight"], (std::vector<int64_t>{192, 48}));
  EXPECT_EQ(shapes["blocks.1.mlp.proj.weight"], (std::vector<int64_t>{48, 192}));
  EXPECT_EQ(shapes["blocks.0.ln1.weight"], (std::vector<int64_t>{48}));
  EXPECT_EQ(shapes["ln_f.bias"], (std::vector<int64_t>{48}));
  EXPECT_EQ(shapes["head.weight"], (std::vector<int64_t>{100, 48}));
  // The closed form lists the same names and shapes in registration order.
  const auto named = NamedParameters(*model);
  const auto closed = ParameterShapes(c);
  ASSERT_EQ(closed.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(closed[i].first, named[i].first);
    EXPECT_EQ(closed[i].second, named[i].second.sizes().vec()) << named[i].first;
  }
}

TEST(ModelTest, InitIsDeterministicFromTheSeedAlone) {
  auto c = Small();
  torch::manual_seed(1);
  const CausalLm a = BuildModel(c);
  torch::manual_seed(2);  // the global generator must not matter
  const CausalLm b = BuildModel(c);
  c.init_seed += 1;
  const CausalLm d = BuildModel(c);
  auto pa = NamedParameters(*a), pb = NamedParameters(*b), pd = NamedParameters(*d);
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
  EXPECT_EQ(pa[0].first, "tok_emb.weight");
  EXPECT_FALSE(torch::equal(pa[0].second, pd[0].second));
  // GPT-2 init scheme.
  auto named = NamedParameters(*a);
  for (auto& [name, p] : named) {
    if (name == "blocks.0.ln1.weight") {
      EXPECT_TRUE(torch::all(p == 1).item<bool>());
    }
    if (name == "blocks.0.attn.qkv.bias") {
      EXPECT_TRUE(torch::all(p == 0).item<bool>());
    }
    if (name == "tok_emb.weight") {
      EXPECT_NEAR(p.std().item<double>(), 0.02, 0.003);
    }
    if (name == "blocks.0.mlp.proj.weight") {
      EXPECT_NEAR(p.std().item<double>(), 0.02 / std::sqrt(6.0), 0.002);
    }
  }
}

TEST(ModelTest, AttentionIsCausal) {
  auto c = Small();
  const CausalLm model = BuildModel(c);
  model->eval();
  auto tokens = torch::randint(0, c.vocab, {2, c.context}, torch::kLong);
  auto changed = tokens.clone();
  changed.index_put_({torch::indexing::Slice(), 10}, (tokens.index({0, 10}).item<int64_t>() + 1) % c.vocab);
  torch::NoGradGuard g;
  auto a = model->forward(tokens), b = model->forward(changed);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::equal(a.index({Slice(), Slice(0, 10)}), b.index({Slice(), Slice(0, 10)})));
  EXPECT_FALSE(torch::equal(a.index({Slice(), Slice(10)}), b.index({Slice(), Slice(10)})));
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, c.context, c.vocab}));
}

TEST(ModelTest, InitialLossIsNearUniform) {
  auto c = Small();
  const CausalLm model = BuildModel(c);
  auto tokens = torch::randint(0, c.vocab, {4, c.context}, torch::kLong);
  const double loss = model->Loss(tokens, tokens).item<double>();
  EXPECT_NEAR(loss, std::log(double(c.vocab)), 0.1);
}

// The GPT family's plan: the Megatron split of its linears, units and fragment groups by block.
TEST(ModelTest, GptPlanNamesItsParallelLayersUnitsAndFragments) {
  const auto c = Small();
  const ParallelPlan plan = PlanOf(c);
  EXPECT_EQ(PlanOf(plan, "blocks.2.attn.qkv.weight").style, TpStyle::kColumn);
  EXPECT_EQ(PlanOf(plan, "blocks.2.attn.qkv.bias").parts, 3);
  EXPECT_EQ(PlanOf(plan, "blocks.0.attn.proj.weight").style, TpStyle::kRow);
  EXPECT_TRUE(PlanOf(plan, "blocks.0.attn.proj.weight").input_major);
  EXPECT_EQ(PlanOf(plan, "blocks.0.mlp.proj.bias").style, TpStyle::kReplicated);
  EXPECT_TRUE(PlanOf(plan, "blocks.0.mlp.proj.bias").sequence_partial);
  EXPECT_TRUE(PlanOf(plan, "blocks.1.ln2.weight").sequence_partial);
  EXPECT_FALSE(PlanOf(plan, "ln_f.weight").sequence_partial);
  EXPECT_EQ(PlanOf(plan, "head.weight").style, TpStyle::kReplicated);
  EXPECT_EQ(UnitOf(plan, "pos_emb.weight", c.n_layer), 0);
  EXPECT_EQ(UnitOf(plan, "blocks.2.mlp.fc.bias", c.n_layer), 3);
  EXPECT_EQ(UnitOf(plan, "ln_f.bias", c.n_layer), c.n_layer + 1);
  std::vector<std::string> names;
  for (const auto& [name, shape] : ParameterShapes(c)) names.push_back(name);
  const auto groups = FragmentGroups(plan, names);
  ASSERT_EQ(groups.size(), names.size());
  EXPECT_EQ(groups.front(), 0);                // tok_emb: with block 0
  EXPECT_EQ(groups[names.size() - 1], 2);      // head: with the last block
  EXPECT_EQ(groups[2 + 12 + 3], 1);            // block 1's fourth parameter
}

TEST(ModelTest, ValidateNamesTheKey) {
  ModelConfig c = Small();
  c.n_head = 5;
  EXPECT_THAT(std::string(Validate(c).message()), ::testing::HasSubstr("model.n_head"));
  c = Small();
  c.context = 0;
  EXPECT_THAT(std::string(Validate(c).message()), ::testing::HasSubstr("model.context"));
}

}  // namespace
}  // namespace atl::inner

namespace atl::inner {
namespace {

// Every tensor-parallel rank's part of every parameter, put back at its ranges of the canonical
// flat order, is the whole model: each split element exactly once, the whole ones on every rank.
TEST(ModelTest, TensorParallelPartsTileTheWholeModel) {
  ModelConfig c;
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.context = 16;
  const CausalLm whole = BuildModel(c);
  const ParallelPlan plan = PlanOf(c);
  for (int size : {2, 4}) {
    std::map<std::string, torch::Tensor> rebuilt, hits;
    for (const auto& [name, p] : NamedParameters(*whole)) {
      rebuilt[name] = torch::zeros({p.numel()});
      hits[name] = torch::zeros({p.numel()});
    }
    for (int rank = 0; rank < size; ++rank) {
      const CausalLm part = BuildModel(c);
      parallel::SliceForTensorParallel(*part, plan, rank, size);
      for (const auto& [name, p] : NamedParameters(*part)) {
        const ParamPlan pp = PlanOf(plan, name);
        const auto shape = whole->named_parameters()[name].sizes().vec();
        EXPECT_EQ(p.sizes().vec(), TpLocalShape(pp, shape, size)) << name;
        const auto ranges = TpRanges(pp, shape, rank, size);
        EXPECT_LE(ranges.size(), 3u) << name;
        const auto flat = CanonicalFlat(pp, p.detach());
        int64_t at = 0;
        for (const auto& [offset, count] : ranges) {
          if (pp.style == TpStyle::kReplicated && rank > 0) break;  // rank 0's copy counts
          rebuilt[name].narrow(0, offset, count).copy_(flat.narrow(0, at, count));
          hits[name].narrow(0, offset, count).add_(1);
          at += count;
        }
      }
    }
    for (const auto& [name, p] : NamedParameters(*whole)) {
      EXPECT_TRUE(torch::equal(hits[name], torch::ones({p.numel()}))) << name << " tp " << size;
      EXPECT_TRUE(torch::equal(rebuilt[name], CanonicalFlat(PlanOf(plan, name), p.detach())))
          << name;
    }
  }
  EXPECT_FALSE(ValidateTensorParallel(c, 3).ok());
  EXPECT_TRUE(ValidateTensorParallel(c, 4).ok());
  // Sequence parallelism splits each sequence's positions too.
  c.context = 18;
  EXPECT_TRUE(ValidateTensorParallel(c, 2, /*sequence_parallel=*/true).ok());
  const auto uneven = ValidateTensorParallel(c, 4, /*sequence_parallel=*/true);
  EXPECT_EQ(uneven.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(uneven.message()), ::testing::HasSubstr("model.context (18)"));
  EXPECT_TRUE(ValidateTensorParallel(c, 4).ok());
}

}  // namespace
}  // namespace atl::inner
