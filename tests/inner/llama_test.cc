// The Llama family's pieces against values computed here independently (closed forms, small
// sizes), its names and shapes, and its refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "inner/model.h"
#include "inner/model/llama/llama.h"

namespace atl::inner {
namespace {

ModelConfig SmallLlama() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 48;
  c.context = 16;
  c.vocab = 64;
  return c;
}

// Llama 2 7B's shape: 6,738,415,616 parameters, its SwiGLU width 11008 by the default rule.
TEST(LlamaTest, ParameterCountsMatchTheModuleAndLlama2) {
  const auto c = SmallLlama();
  int64_t n = 0;
  for (const auto& p : BuildModel(c)->parameters()) n += p.numel();
  EXPECT_EQ(n, ParameterCount(c));
  ModelConfig seven_b;
  seven_b.arch = "llama";
  seven_b.n_layer = 32;
  seven_b.d_model = 4096;
  seven_b.n_head = 32;
  seven_b.context = 4096;
  seven_b.vocab = 32000;
  EXPECT_EQ(llama::FfnHidden(seven_b), 11008);
  EXPECT_EQ(ParameterCount(seven_b), 6738415616LL);
  seven_b.tie_embeddings = true;
  EXPECT_EQ(ParameterCount(seven_b), 6738415616LL - 32000LL * 4096);
}

TEST(LlamaTest, NamesAndShapesAreHuggingFacesWithoutTheModelPrefix) {
  const auto c = SmallLlama();
  const CausalLm model = BuildModel(c);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& [name, p] : NamedParameters(*model)) shapes[name] = p.sizes().vec();
  EXPECT_EQ(shapes.size(), size_t(1 + 9 * c.n_layer + 2));
  EXPECT_EQ(shapes["embed_tokens.weight"], (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(shapes["layers.1.self_attn.q_proj.weight"], (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shapes["layers.1.self_attn.k_proj.weight"], (std::vector<int64_t>{16, 32}));  // 2 of 4 heads
  EXPECT_EQ(shapes["layers.1.self_attn.v_proj.weight"], (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(shapes["layers.0.self_attn.o_proj.weight"], (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shapes["layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(shapes["layers.0.mlp.up_proj.weight"], (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(shapes["layers.0.mlp.down_proj.weight"], (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(shapes["layers.0.input_layernorm.weight"], (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes["layers.0.post_attention_layernorm.weight"], (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes["norm.weight"], (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{64, 32}));
  const auto named = NamedParameters(*model);
  const auto closed = ParameterShapes(c);
  ASSERT_EQ(closed.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(closed[i].first, named[i].first);
    EXPECT_EQ(closed[i].second, named[i].second.sizes().vec()) << named[i].first;
  }
  // The plan: projections split, norms whole (partial under sequence parallelism).
  const ParallelPlan plan = PlanOf(c);
  EXPECT_EQ(PlanOf(plan, "layers.1.self_attn.k_proj.weight").style, TpStyle::kColumn);
  EXPECT_EQ(PlanOf(plan, "layers.1.mlp.down_proj.weight").style, TpStyle::kRow);
  EXPECT_TRUE(PlanOf(plan, "layers.1.input_layernorm.weight").sequence_partial);
  EXPECT_EQ(UnitOf(plan, "embed_tokens.weight", c.n_layer), 0);
  EXPECT_EQ(UnitOf(plan, "layers.1.mlp.up_proj.weight", c.n_layer), 2);
  EXPECT_EQ(UnitOf(plan, "lm_head.weight", c.n_layer), c.n_layer + 1);
  // Tied: no head of its own.
  auto tied = c;
  tied.tie_embeddings = true;
  for (auto& [name, p] : NamedParameters(*BuildModel(tied))) EXPECT_NE(name, "lm_head.weight");
}

// RMSNorm: y_i = x_i / sqrt(mean_j x_j^2 + eps) * w_i.
TEST(LlamaTest, RmsNormIsItsClosedForm) {
  llama::RmsNorm norm(4, 1e-5);
  torch::NoGradGuard no_grad;
  norm->weight.copy_(torch::tensor({1.0f, 2.0f, 0.5f, -1.0f}));
  const float x[2][4] = {{3, 4, 0, -1}, {0.5f, 0.25f, -2, 8}};
  const float w[4] = {1, 2, 0.5f, -1};
  const auto y = norm->forward(torch::from_blob(const_cast<float*>(&x[0][0]), {2, 4}).clone());
  for (int r = 0; r < 2; ++r) {
    double mean_square = 0;
    for (float v : x[r]) mean_square += double(v) * v / 4;
    for (int i = 0; i < 4; ++i) {
      const double want = x[r][i] / std::sqrt(mean_square + 1e-5) * w[i];
      EXPECT_NEAR(y[r][i].item<double>(), want, 1e-6 * std::abs(want) + 1e-7) << r << "," << i;
    }
  }
}

// Rotary embeddings, head_dim 4: at position p dimensions (0, 2) turn by p, (1, 3) by
// p / theta^(2/4); and a query and a key turned to positions m and n meet as at m - n.
TEST(LlamaTest, RotaryEmbeddingsTurnPairsAsTheClosedFormSays) {
  const double theta = 100;
  const float x[4] = {1, 2, 3, 4};
  auto in = torch::from_blob(const_cast<float*>(x), {1, 1, 1, 4}).expand({1, 1, 3, 4}).clone();
  const auto y = llama::ApplyRotary(in, theta);
  for (int p = 0; p < 3; ++p) {
    const double a = p, b = p / std::sqrt(theta);
    const double want[4] = {x[0] * std::cos(a) - x[2] * std::sin(a),
                            x[1] * std::cos(b) - x[3] * std::sin(b),
                            x[2] * std::cos(a) + x[0] * std::sin(a),
                            x[3] * std::cos(b) + x[1] * std::sin(b)};
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(y[0][0][p][i].item<double>(), want[i], 1e-5) << "position " << p << " dim " << i;
    }
  }
  torch::manual_seed(3);
  const auto q = torch::randn({1, 1, 1, 8}), k = torch::randn({1, 1, 1, 8});
  auto at = [&](const torch::Tensor& v, int64_t pos) { return llama::ApplyRotary(v, 10000, pos); };
  const double d1 = (at(q, 5) * at(k, 2)).sum().item<double>();
  const double d2 = (at(q, 9) * at(k, 6)).sum().item<double>();
  EXPECT_NEAR(d1, d2, 1e-4);
}

// Grouped-query attention: one key/value head serving 4 query heads computes what multi-head
// attention computes with that head's keys and values copied to every head.
TEST(LlamaTest, GroupedQueryAttentionEqualsMultiHeadWithSharedHeadsCopied) {
  auto gqa = SmallLlama();
  gqa.n_kv_head = 1;
  auto mha = gqa;
  mha.n_kv_head = 4;
  const CausalLm a = BuildModel(gqa), b = BuildModel(mha);
  {
    torch::NoGradGuard no_grad;
    auto pa = a->named_parameters(), pb = b->named_parameters();
    for (const auto& item : pa) {
      const auto& name = item.key();
      if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos) {
        pb[name].copy_(item.value().repeat({4, 1}));  // [8, 32] -> [32, 32]: head 0 four times
      } else {
        pb[name].copy_(item.value());
      }
    }
  }
  const auto tokens = torch::randint(0, gqa.vocab, {2, gqa.context}, torch::kLong);
  const auto la = a->forward(tokens), lb = b->forward(tokens);
  EXPECT_LT((la - lb).abs().max().item<double>(), 1e-5);
  // And causal: a later token changes no earlier position's logits.
  auto changed = tokens.clone();
  changed[0][10] = (changed[0][10].item<int64_t>() + 1) % gqa.vocab;
  const auto lc = a->forward(changed);
  EXPECT_LT((lc[0].narrow(0, 0, 10) - la[0].narrow(0, 0, 10)).abs().max().item<double>(), 1e-6);
  EXPECT_GT((lc[0][10] - la[0][10]).abs().max().item<double>(), 1e-6);
}

TEST(LlamaTest, ConfigsThatDoNotFitAreRefusedByKey) {
  auto c = SmallLlama();
  EXPECT_TRUE(Validate(c).ok());
  c.n_kv_head = 3;
  EXPECT_THAT(std::string(Validate(c).message()), ::testing::HasSubstr("model.n_kv_head (3)"));
  c = SmallLlama();
  c.arch = "gpt2";
  EXPECT_THAT(std::string(Validate(c).message()),
              ::testing::HasSubstr("applies to model.arch = \"llama\" only"));
  c = SmallLlama();
  c.rope_theta = 0;
  EXPECT_THAT(std::string(Validate(c).message()), ::testing::HasSubstr("model.rope_theta"));
  // Tensor parallelism splits the key/value heads too.
  c = SmallLlama();
  EXPECT_TRUE(ValidateTensorParallel(c, 2).ok());
  const auto four = ValidateTensorParallel(c, 4);
  EXPECT_EQ(four.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(four.message()), ::testing::HasSubstr("model.n_kv_head: 2"));
  // Llama 7B-like: 6 x parameters plus attention, the embedding lookup not counted.
  ModelConfig f = SmallLlama();
  const double n = double(ParameterCount(f)) - double(f.vocab) * f.d_model;
  EXPECT_DOUBLE_EQ(TrainFlopsPerToken(f), 6 * n + 6.0 * f.n_layer * f.context * f.d_model);
}

// Decoding with the key/value cache (the prompt at once, then one position per token) gives the
// logits the whole sequence's forward gives at every position, for both families.
TEST(DecodeTest, TheKeyValueCacheGivesTheFullForwardsLogits) {
  ModelConfig gpt;
  gpt.n_layer = 2;
  gpt.d_model = 32;
  gpt.n_head = 4;
  gpt.context = 16;
  gpt.vocab = 64;
  for (const auto& c : {SmallLlama(), gpt}) {
    const CausalLm model = BuildModel(c);
    model->eval();
    torch::NoGradGuard no_grad;
    torch::manual_seed(7);
    const auto tokens = torch::randint(0, c.vocab, {1, c.context}, torch::kLong);
    const auto full = model->forward(tokens)[0];  // [T, vocab]
    KvCache cache;
    const int64_t prompt = 5;
    auto got = model->Decode(tokens.narrow(1, 0, prompt), cache)[0];
    EXPECT_EQ(cache.length, prompt);
    EXPECT_LT((got - full.narrow(0, 0, prompt)).abs().max().item<double>(), 1e-5);
    for (int64_t t = prompt; t < c.context; ++t) {
      const auto step = model->Decode(tokens.narrow(1, t, 1), cache)[0][0];
      EXPECT_LT((step - full[t]).abs().max().item<double>(), 1e-5)
          << c.arch << " position " << t;
    }
    EXPECT_EQ(cache.length, c.context);
    EXPECT_EQ(cache.keys[0].size(2), c.context);
    EXPECT_EQ(cache.keys[0].size(1), llama::KvHeads(c));  // the cache holds key/value heads only
  }
}

}  // namespace
}  // namespace atl::inner
