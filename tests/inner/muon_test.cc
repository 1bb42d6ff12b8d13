// Muon's pieces on one rank: the Newton-Schulz iteration against the quintic written out here in
// double, and the step's routing (the blocks' matrices by Muon with Moonlight's scale, the rest by
// AdamW). Its parity on meshes is in fsdp_test.cc, its checkpoints in trainer_test.cc.
#include "inner/muon.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "inner/model.h"
#include "inner/parallel/fsdp.h"
#include "inner/parallel/mesh.h"
#include "inner/trainer.h"
#include "tests/test_util.h"

namespace atl::inner {
namespace {

// The iteration as Jordan et al. write it, in double.
torch::Tensor Quintic(torch::Tensor g, int steps) {
  auto x = g.to(torch::kDouble);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() + 1e-7);
  for (int k = 0; k < steps; ++k) {
    auto a = x.mm(x.t());
    auto b = -4.7750 * a + 2.0315 * a.mm(a);
    x = 3.4445 * x + b.mm(x);
  }
  return tall ? x.t() : x;
}

TEST(MuonTest, NewtonSchulzIsTheQuinticAndNearlyOrthogonalizes) {
  torch::manual_seed(3);
  const auto g = torch::randn({24, 40});
  const auto o = NewtonSchulz(g, 5);
  ASSERT_EQ(o.sizes(), g.sizes());
  EXPECT_TRUE(torch::allclose(o.to(torch::kDouble), Quintic(g, 5), 1e-4, 1e-5));
  // Its singular values gather near 1 (the quintic trades exactness for speed: about 0.7-1.2).
  const auto s = at::linalg_svdvals(o);
  const double before = (at::linalg_svdvals(g).min() / at::linalg_svdvals(g).max()).item<double>();
  std::printf("singular values %.3f..%.3f (input's ratio %.3f)\n", s.min().item<double>(),
              s.max().item<double>(), before);
  EXPECT_GT(s.min().item<double>(), 0.5);
  EXPECT_LT(s.max().item<double>(), 1.3);
  // A tall matrix runs as its transpose: the same bits.
  EXPECT_TRUE(torch::equal(NewtonSchulz(g.t(), 5), o.t()));
  // Scale-free: a gradient 1000x larger gives the same direction.
  EXPECT_TRUE(torch::allclose(NewtonSchulz(g * 1000, 5), o, 1e-4, 1e-5));
}

// One step on one rank: each matrix of the blocks (each of GPT's q, k and v on its own) moves by
// lr (0.2 sqrt(max(rows, cols)) NewtonSchulz(G + mu m) + wd W), everything else as AdamW moves it.
TEST(MuonTest, StepsTheBlocksMatricesByMuonAndTheRestByAdamW) {
  auto c = testing::TinyConfig("");
  c.optim.name = InnerOptimizerName::kMuon;
  auto mesh = parallel::DeviceMesh::Single();
  auto model = parallel::FsdpModel::Create(c.model, *mesh, "cpu", {});
  ASSERT_TRUE(model.ok()) << model.status();
  torch::manual_seed(5);
  for (auto& s : (*model)->shards()) s.grad.copy_(torch::randn_like(s.grad));
  std::map<std::string, torch::Tensor> before, grads;
  for (const auto& item : (*model)->module()->named_parameters()) {
    before[item.key()] = item.value().detach().clone();
    grads[item.key()] = item.value().grad().detach().clone();
  }
  // AdamW's reference, on copies of the shards that are not the blocks' matrices.
  std::vector<AdamWParam> rest;
  std::map<std::string, torch::Tensor> rest_values;
  const auto plan = (*model)->plan();
  auto is_matrix = [&](const std::string& name) {
    return PlanOf(plan, name).block >= 0 && before[name].dim() == 2;
  };
  for (const auto& s : (*model)->shards()) {
    if (is_matrix(s.name)) continue;
    rest_values[s.name] = s.value.clone();
    rest.push_back({s.name, rest_values[s.name], s.grad.clone(), s.decay});
  }
  AdamW reference(std::move(rest), c.optim.adamw);

  auto muon = NewInnerOptimizer(c.optim, c.model, **model);
  ASSERT_TRUE(muon.ok()) << muon.status();
  const double lr = 0.02, mu = c.optim.muon.momentum, wd = c.optim.adamw.weight_decay;
  ASSERT_TRUE((*muon)->Step(lr).ok());
  reference.Step(lr);

  int matrices = 0;
  for (const auto& item : (*model)->module()->named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    if (!is_matrix(name)) continue;
    ++matrices;
    const int parts = PlanOf(plan, name).parts;
    const int64_t rows = p.size(0) / parts, cols = p.size(1);
    const auto u = grads[name] + mu * grads[name];  // the first step's Nesterov direction
    std::vector<torch::Tensor> o;
    for (int k = 0; k < parts; ++k) o.push_back(NewtonSchulz(u.narrow(0, k * rows, rows), 5));
    const auto want = before[name] * (1 - lr * wd) -
                      lr * 0.2 * std::sqrt(double(std::max(rows, cols))) * torch::cat(o, 0);
    EXPECT_TRUE(torch::allclose(p.detach(), want, 1e-5, 1e-7)) << name;
  }
  EXPECT_EQ(matrices, 4 * c.model.n_layer);  // q/k/v, the projection, the MLP's two
  for (size_t i = 0; i < (*model)->shards().size(); ++i) {
    const auto& s = (*model)->shards()[i];
    const auto state = (*muon)->ShardState(i);
    if (is_matrix(s.name)) {
      ASSERT_EQ(state.size(), 1u);
      EXPECT_EQ(state[0].name, "momentum");
      EXPECT_TRUE(torch::equal(state[0].tensor, s.grad));  // m = 0 mu + G
    } else {
      ASSERT_EQ(state.size(), 2u);
      EXPECT_EQ(state[0].name, "exp_avg");
      EXPECT_TRUE(torch::equal(s.value, rest_values[s.name])) << s.name;
    }
  }
}

// Muon's settings are checked when the config loads, by name.
TEST(MuonTest, OutOfRangeSettingsAreRefusedByName) {
  TrainConfig train;
  OptimConfig o;
  o.muon.momentum = 1.0;
  EXPECT_THAT(std::string(Validate(o, train).message()), ::testing::HasSubstr("optim.muon_momentum"));
  o = OptimConfig();
  o.muon.ns_steps = 0;
  EXPECT_THAT(std::string(Validate(o, train).message()), ::testing::HasSubstr("optim.muon_ns_steps"));
  o.muon.ns_steps = 5;
  EXPECT_TRUE(Validate(o, train).ok());
}

// Muon trains: on the tiny preset at its default settings the loss falls as AdamW's does.
TEST(MuonTest, TrainsTheTinyModel) {
  auto c = testing::TinyConfig("");
  c.train.steps = 60;
  auto corpus = TokenCorpus::FromText(testing::GeneratedText(60000, 1));
  auto data = MakeDataset(corpus, nullptr, c.data.val_fraction, c.model.context, c.data.seed);
  ASSERT_TRUE(data.ok()) << data.status();
  std::map<InnerOptimizerName, double> last;
  for (auto name : {InnerOptimizerName::kAdamW, InnerOptimizerName::kMuon}) {
    c.optim.name = name;
    auto t = Trainer::Create(c.trainer(), *data);
    ASSERT_TRUE(t.ok()) << t.status();
    double first = 0;
    for (int i = 0; i < 60; ++i) {
      auto s = (*t)->Step();
      ASSERT_TRUE(s.ok()) << s.status();
      if (i == 0) first = s->loss;
      last[name] = s->loss;
    }
    std::printf("%s: loss %.4f -> %.4f\n", ConfigValueText(name).c_str(), first, last[name]);
    EXPECT_LT(last[name], 0.8 * first);
  }
  EXPECT_LT(last[InnerOptimizerName::kMuon], 1.05 * last[InnerOptimizerName::kAdamW]);
}

}  // namespace
}  // namespace atl::inner
