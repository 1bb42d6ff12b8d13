// Tokens/s of atoll's training loop against a bare libtorch loop on the same model and batch,
// measured side by side in one run (interleaved rounds in alternating order, median of each).
//
//   build/tests/bench/train_bench [deploy/configs/tiny.toml] [rounds=11] [steps_per_round=20]
//
// The bare loop is what a user would write by hand: one fixed batch already in memory, forward,
// backward, clip, torch::optim::AdamW. The atoll loop is inner::RunLoop as `atoll train` runs it:
// sampling windows from a corpus, accumulation, schedule, its own AdamW, and per step a metrics
// record plus a progress update.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "inner/trainer.h"
#include "src/config/config.h"
#include "src/observe/metrics.h"
#include "tests/test_util.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config_path = argc > 1 ? argv[1] : ATOLL_SOURCE_DIR "/deploy/configs/tiny.toml";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 11;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 20;
  auto config = atl::LoadConfig(config_path, {{"data.path", "unused"}});
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  auto c = *config;
  c.train.steps = int64_t(rounds) * steps * 2 + 10;
  c.train.eval_every = 0;
  c.optim.warmup_steps = 0;
  const int64_t tokens_per_step = int64_t(c.train.batch_size) * c.train.grad_accum * c.model.context;

  // atoll: trainer over a generated corpus.
  auto corpus = atl::inner::TokenCorpus::FromText(atl::testing::GeneratedText(4 << 20, 1));
  auto data = atl::inner::MakeDataset(corpus, nullptr, 0.01, c.model.context, 1);
  auto trainer = atl::inner::Trainer::Create(c.trainer(), *data);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trainer.status().message()).c_str());
    return 2;
  }
  atl::testing::TempDir dir;
  auto log = atl::MetricsLog::Open(dir.Join("metrics.jsonl"), 0);
  FILE* devnull = std::fopen("/dev/null", "w");
  atl::Progress progress(devnull, /*tty=*/true, c.train.steps, c.train.log_every, "");
  atl::StepReporter reporter(**log, progress);
  // Every step reported, as `atoll train` reports its log steps.
  atl::StepReports reports(&reporter, /*log_every=*/1);
  const std::vector<atl::inner::LoopPart*> observer = {&reports};

  // Bare libtorch: same model class and init, a fixed batch, torch's AdamW.
  const atl::inner::CausalLm model = atl::inner::BuildModel(c.model);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.optim.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  groups.emplace_back(decay, opts(c.optim.adamw.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  torch::optim::AdamW adamw(std::move(groups));
  // One fixed batch of real windows from the same corpus.
  auto x = torch::empty({c.train.batch_size, c.model.context}, torch::kLong);
  auto y = torch::empty({c.train.batch_size, c.model.context}, torch::kLong);
  for (int b = 0; b < c.train.batch_size; ++b) {
    (*data)->train.Fill(size_t(b) * 7, x.data_ptr<int64_t>() + b * c.model.context,
                        y.data_ptr<int64_t>() + b * c.model.context);
  }
  auto bare_step = [&] {
    adamw.zero_grad();
    for (int m = 0; m < c.train.grad_accum; ++m) {
      auto loss = model->Loss(x, y);
      if (c.train.grad_accum > 1) loss = loss / double(c.train.grad_accum);
      loss.backward();
      loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), c.optim.grad_clip);
    adamw.step();
  };

  // Warm up both (allocator, thread pool), then interleave rounds.
  for (int i = 0; i < 3; ++i) bare_step();
  if (!atl::inner::RunLoop(**trainer, 3, observer).ok()) return 1;
  // Rounds alternate which loop goes first, so drift in machine load hits both alike.
  std::vector<double> bare_tps, atoll_tps;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  for (int r = 0; r < rounds; ++r) {
    for (int which = 0; which < 2; ++which) {
      const bool bare_now = (which == 0) == (r % 2 == 0);
      const auto t0 = Clock::now();
      if (bare_now) {
        for (int i = 0; i < steps; ++i) bare_step();
      } else if (!atl::inner::RunLoop(**trainer, (*trainer)->step() + steps, observer).ok()) {
        return 1;
      }
      (bare_now ? bare_tps : atoll_tps).push_back(double(steps * tokens_per_step) / seconds_since(t0));
    }
  }
  const double bare = Median(bare_tps), ours = Median(atoll_tps);
  std::printf("config %s: %.2fM parameters, %lld tokens/step, %d threads, %d rounds x %d steps\n",
              config_path.c_str(), double(atl::inner::ParameterCount(c.model)) / 1e6,
              (long long)tokens_per_step, torch::get_num_threads(), rounds, steps);
  std::printf("bare libtorch loop   %10.0f tokens/s (median)\n", bare);
  std::printf("atoll training loop  %10.0f tokens/s (median)\n", ours);
  std::printf("atoll / bare         %10.3f  (framework overhead %.1f%%)\n", ours / bare,
              100.0 * (1.0 - ours / bare));
  std::fclose(devnull);
  return 0;
}
