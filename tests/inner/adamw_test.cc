#include "inner/adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace atl::inner {
namespace {

// atoll's AdamW must reproduce torch::optim::AdamW bit for bit (decay on matrices only).
TEST(AdamWTest, BitIdenticalToTorchAdamW) {
  torch::manual_seed(0);
  auto w1 = torch::randn({8, 5}, torch::requires_grad());
  auto b1 = torch::randn({5}, torch::requires_grad());
  auto w2 = w1.detach().clone().requires_grad_(true);
  auto b2 = b1.detach().clone().requires_grad_(true);

  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamW ours(std::vector<std::pair<std::string, torch::Tensor>>{{"w", w1}, {"b", b1}}, o);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{w2},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{b2},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0)));
  torch::optim::AdamW theirs(std::move(groups));

  auto x = torch::randn({16, 8});
  for (int step = 0; step < 20; ++step) {
    const double lr = 1e-2 * (1.0 - step / 40.0);
    ours.ZeroGrad();
    theirs.zero_grad();
    (torch::tanh(x.matmul(w1) + b1).pow(2).sum()).backward();
    (torch::tanh(x.matmul(w2) + b2).pow(2).sum()).backward();
    for (auto& g : theirs.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    }
    ours.Step(lr);
    theirs.step();
    ASSERT_TRUE(torch::equal(w1, w2)) << "step " << step;
    ASSERT_TRUE(torch::equal(b1, b2)) << "step " << step;
  }
  EXPECT_EQ(ours.step(), 20);
}

TEST(AdamWTest, LoadStateIsAllOrNothing) {
  auto w = torch::zeros({3, 3}, torch::requires_grad());
  AdamW opt(std::vector<std::pair<std::string, torch::Tensor>>{{"w", w}}, AdamWOptions{});
  w.mutable_grad() = torch::ones({3, 3});
  opt.Step(0.1);
  auto before = opt.State();
  std::vector<NamedTensor> bad = {{"exp_avg/w", torch::ones({3, 3})},
                                  {"exp_avg_sq/w", torch::ones({2, 3})}};
  auto s = opt.LoadState(5, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opt.step(), 1);
  EXPECT_FALSE(torch::equal(opt.State()[0].tensor, torch::ones({3, 3})));
  EXPECT_EQ(opt.LoadState(5, {{"exp_avg/w", torch::ones({3, 3})}}).code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl::inner
