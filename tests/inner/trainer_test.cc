#include "inner/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "inner/parallel/fsdp.h"
#include "inner/torch_compat.h"
#include "tests/test_util.h"

namespace atl::inner {
namespace {

using ::atl::testing::TinyConfig;

std::shared_ptr<const Dataset> Data(const Config& c, uint64_t text_seed = 1) {
  auto corpus = TokenCorpus::FromText(testing::GeneratedText(60000, text_seed));
  auto d = MakeDataset(corpus, nullptr, c.data.val_fraction, c.model.context, c.data.seed);
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

std::unique_ptr<Trainer> Make(const Config& c, std::shared_ptr<const Dataset> data) {
  auto t = Trainer::Create(c.trainer(), std::move(data));
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(ScheduleTest, WarmupThenCosineToTheFloor) {
  OptimConfig o;
  o.lr = 1.0;
  o.warmup_steps = 10;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(o, 0, 110), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, 9, 110), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 10, 110), 1.0);
  EXPECT_NEAR(LearningRate(o, 60, 110), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 110, 110), 0.1, 1e-12);
  EXPECT_NEAR(LearningRate(o, 500, 110), 0.1, 1e-12);
}

// train.device: "auto" is the rank's own GPU where there is one, else the CPU; "cuda" is the
// rank's own GPU; a GPU asked for where there is none is refused by name.
TEST(TrainerTest, DevicesResolvePerRank) {
  EXPECT_EQ(*ResolveDevice("auto", 3, true), "cuda:3");
  EXPECT_EQ(*ResolveDevice("auto", 3, false), "cpu");
  EXPECT_EQ(*ResolveDevice("cuda", 1, true), "cuda:1");
  EXPECT_EQ(*ResolveDevice("cuda:0", 1, true), "cuda:0");
  EXPECT_EQ(*ResolveDevice("cpu", 1, true), "cpu");
  EXPECT_EQ(ResolveDevice("cuda", 0, false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ResolveDevice("cuda:x", 0, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("tpu", 0, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("cuda7", 0, false).status().code(), absl::StatusCode::kInvalidArgument);
  TrainConfig auto_device;
  auto_device.device = "auto";
  EXPECT_TRUE(Validate(auto_device).ok());  // loads anywhere; resolves where it trains
}

// bf16 autocast: the matrix products run in bf16 (the losses differ from fp32's from the first
// step), the parameters, gradients and AdamW state stay fp32, and training follows fp32's closely.
TEST(TrainerTest, Bf16AutocastTrainsLikeFp32) {
  auto c = TinyConfig("");
  c.train.steps = 60;
  auto data = Data(c);
  auto fp32 = Make(c, data);
  c.train.mixed_precision = inner::MixedPrecision::kBf16;
  auto bf16 = Make(c, data);
  double first32 = 0, first16 = 0, last32 = 0, last16 = 0;
  for (int i = 0; i < 60; ++i) {
    const auto a = *fp32->Step(), b = *bf16->Step();
    if (i == 0) first32 = a.loss, first16 = b.loss;
    last32 = a.loss, last16 = b.loss;
  }
  std::printf("loss fp32 %.4f -> %.4f, bf16 %.4f -> %.4f\n", first32, last32, first16, last16);
  EXPECT_NE(first16, first32);                    // autocast is on
  EXPECT_NEAR(first16, first32, 0.01 * first32);  // the same model
  EXPECT_LT(last16, 0.8 * first16);               // it trains
  EXPECT_NEAR(last16, last32, 0.02 * last32);     // as fp32 does, within 2%
  EXPECT_NEAR(bf16->Evaluate()->loss, fp32->Evaluate()->loss, 0.02 * last32);
  for (const auto& s : bf16->sharded().shards()) {
    EXPECT_EQ(s.value.scalar_type(), at::kFloat) << s.name;
    EXPECT_EQ(s.grad.scalar_type(), at::kFloat) << s.name;
  }
}

// On a GPU: fp32 training follows the CPU's (to the rounding of other kernels), bf16 autocast
// trains as fp32 does within 2%, and the parameters, gradients and optimizer stay fp32 there.
TEST(TrainerTest, GpuTrainsLikeTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto c = TinyConfig("");
  c.train.steps = 40;
  auto data = Data(c);
  auto cpu = Make(c, data);
  c.train.device = "cuda";
  auto gpu = Make(c, data);
  c.train.mixed_precision = inner::MixedPrecision::kBf16;
  auto bf16 = Make(c, data);
  double first = 0, last_cpu = 0, last_gpu = 0, last_bf16 = 0;
  for (int i = 0; i < 40; ++i) {
    const auto a = *cpu->Step(), b = *gpu->Step(), d = *bf16->Step();
    if (i == 0) {
      first = a.loss;
      EXPECT_NEAR(b.loss, a.loss, 1e-4 * a.loss);
    }
    last_cpu = a.loss, last_gpu = b.loss, last_bf16 = d.loss;
  }
  std::printf("loss %.4f -> cpu %.4f, gpu fp32 %.4f, gpu bf16 %.4f\n", first, last_cpu, last_gpu,
              last_bf16);
  EXPECT_LT(last_gpu, 0.8 * first);
  EXPECT_NEAR(last_gpu, last_cpu, 1e-2 * last_cpu);
  EXPECT_NEAR(last_bf16, last_gpu, 0.02 * last_gpu);
  for (const auto& s : bf16->sharded().shards()) {
    EXPECT_TRUE(s.value.is_cuda()) << s.name;
    EXPECT_EQ(s.value.scalar_type(), at::kFloat) << s.name;
    EXPECT_EQ(s.grad.scalar_type(), at::kFloat) << s.name;
  }
}

// Steps queued without waiting for the device report, when their stats are taken in batches,
// exactly what steps taken one at a time report; Step refuses to run over stats not yet taken.
TEST(TrainerTest, QueuedStepsReportWhatSingleStepsDo) {
  auto c = TinyConfig("");
  c.optim.grad_clip = 0.5;  // clipped on some steps
  auto data = Data(c);
  auto single = Make(c, data), queued = Make(c, data);
  std::vector<StepStats> want;
  for (int i = 0; i < 7; ++i) want.push_back(*single->Step());
  std::vector<StepStats> got;
  for (int batch : {3, 1, 3}) {
    for (int i = 0; i < batch; ++i) ASSERT_TRUE(queued->QueueStep().ok());
    EXPECT_EQ(queued->pending_steps(), batch);
    if (batch == 3) {
      EXPECT_EQ(queued->Step().status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ(queued->step(), int64_t(got.size()) + batch);  // refused before it ran
    }
    auto stats = queued->TakeStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    got.insert(got.end(), stats->begin(), stats->end());
    EXPECT_EQ(queued->pending_steps(), 0);
  }
  EXPECT_TRUE(queued->TakeStats()->empty());
  ASSERT_EQ(got.size(), want.size());
  bool clipped = false;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].step, int64_t(i) + 1);
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].loss, want[i].loss) << i;
    EXPECT_EQ(got[i].grad_norm, want[i].grad_norm) << i;
    EXPECT_EQ(got[i].lr, want[i].lr) << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
    EXPECT_GT(got[i].compute_s, 0) << i;
    clipped = clipped || want[i].grad_norm > c.optim.grad_clip;
  }
  EXPECT_TRUE(clipped);
  EXPECT_TRUE(torch::equal(single->sharded().shards()[0].value, queued->sharded().shards()[0].value));
}

// Clipping on the device: a bound the norm never reaches leaves every bit as no clipping does; a
// bound it passes scales the gradients (seen through AdamW with a large eps, where the update is
// not scale-invariant).
TEST(TrainerTest, ClippingActsOnlyAboveTheBound) {
  auto c = TinyConfig("");
  c.optim.adamw.eps = 1.0;
  auto data = Data(c);
  auto run = [&](double clip) {
    auto d = c;
    d.optim.grad_clip = clip;
    auto t = Make(d, data);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(t->Step().ok());
    return t->sharded().shards()[0].value.clone();
  };
  const auto none = run(0), loose = run(1e9), tight = run(1e-3);
  EXPECT_TRUE(torch::equal(loose, none));
  EXPECT_FALSE(torch::allclose(tight, none));
}

// On a GPU, nothing in a step makes the host wait for the device (libtorch's sync debug mode
// throws on any operation that would), fp32 and bf16, clipping active; the stats come over after.
TEST(TrainerTest, GpuStepsQueueWithoutHostSyncs) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(compat::ThrowOnDeviceSync::active()) << "a GPU but no CUDA libtorch build";
  for (const MixedPrecision precision : {MixedPrecision::kNone, MixedPrecision::kBf16}) {
    auto c = TinyConfig("");
    c.train.device = "cuda";
    c.train.mixed_precision = precision;
    c.optim.grad_clip = 0.5;
    auto t = Make(c, Data(c));
    ASSERT_TRUE(t->Step().ok());  // first allocations
    {
      const compat::ThrowOnDeviceSync strict;
      for (int i = 0; i < 3; ++i) {
        const auto s = t->QueueStep();
        ASSERT_TRUE(s.ok()) << ConfigValueText(precision) << ": " << s;
      }
    }
    const auto stats = t->TakeStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->size(), 3u);
    for (const auto& s : *stats) EXPECT_TRUE(std::isfinite(s.loss) && s.grad_norm > 0) << ConfigValueText(precision);
  }
}

TEST(TrainerTest, JumpsAndRampsMoveTheScheduleAsAsked) {
  auto c = TinyConfig("");
  c.optim.warmup_steps = 0;
  c.train.steps = 100;
  auto data = Data(c);
  auto t = Make(c, data);
  t->SetStep(50);  // a late joiner: the schedule continues from the run's step
  EXPECT_DOUBLE_EQ(t->Step()->lr, LearningRate(c.optim, 50, 100));
  t->RampLearningRate(4);  // fresh optimizer state: 1/4, 2/4, 3/4, 4/4 of the schedule
  for (int k = 1; k <= 5; ++k) {
    const int64_t at = t->step();
    const double want = LearningRate(c.optim, at, 100) * (k <= 4 ? k / 4.0 : 1.0);
    EXPECT_DOUBLE_EQ(t->Step()->lr, want) << k;
  }
  t->SetSchedulePosition(90);  // async: the run's progress, whatever this island's step count
  EXPECT_DOUBLE_EQ(t->Step()->lr, LearningRate(c.optim, 90, 100));
  EXPECT_EQ(t->step(), 57);
}

TEST(TrainerTest, SameSeedGivesBitIdenticalLosses) {
  auto c = TinyConfig("");
  auto data = Data(c);
  auto a = Make(c, data), b = Make(c, data);
  for (int i = 0; i < 8; ++i) {
    const auto sa = *a->Step(), sb = *b->Step();
    ASSERT_EQ(sa.loss, sb.loss) << "step " << i;
    ASSERT_EQ(sa.grad_norm, sb.grad_norm);
  }
  EXPECT_EQ(a->Evaluate()->loss, b->Evaluate()->loss);
  c.model.init_seed += 1;
  auto d = Make(c, data);
  EXPECT_NE(d->Step()->loss, Make(TinyConfig(""), data)->Step()->loss);
}

// Entropy (nats) of the byte distribution: the loss of the best model that ignores context.
double UnigramEntropy(const std::string& text) {
  double counts[256] = {};
  for (unsigned char ch : text) counts[ch] += 1;
  double h = 0;
  for (double n : counts) {
    if (n > 0) h -= n / double(text.size()) * std::log(n / double(text.size()));
  }
  return h;
}

TEST(TrainerTest, LossFallsWellBelowTheUnigramEntropy) {
  auto c = TinyConfig("");
  c.train.steps = 150;
  auto data = Data(c);
  const double unigram = UnigramEntropy(testing::GeneratedText(60000, 1));
  auto t = Make(c, data);
  const double before = t->Evaluate()->loss;
  EXPECT_NEAR(before, std::log(256.0), 0.3);
  for (int i = 0; i < 150; ++i) ASSERT_TRUE(t->Step().ok());
  const auto after = *t->Evaluate();
  EXPECT_LT(after.loss, 0.75 * unigram) << "from " << before << ", unigram " << unigram;
  EXPECT_TRUE(after.per_byte);
  EXPECT_DOUBLE_EQ(after.bits, after.loss / std::log(2.0));
  EXPECT_EQ(t->tokens(), 150 * 4 * 32);
}

TEST(TrainerTest, TokenShardsReportBitsPerByteFromTheirTokensLengths) {
  // The same tokens as text (one byte each) and as "shards" whose every token stands for 2
  // bytes, except token 'e' for 5: the loss is the same, bits per byte follow the lengths.
  auto c = TinyConfig("");
  auto bytes = Data(c);
  auto shards = std::make_shared<Dataset>(*bytes);
  shards->per_byte = false;
  shards->token_bytes.assign(256, 2.0f);
  shards->token_bytes['e'] = 5.0f;
  const auto as_text = *Make(c, bytes)->Evaluate();
  const auto as_shards = *Make(c, shards)->Evaluate();
  EXPECT_EQ(as_text.loss, as_shards.loss);
  EXPECT_DOUBLE_EQ(as_text.bits_per_byte, as_text.bits);
  // Independently: the bytes of the evaluated windows' targets, counted here.
  const size_t total = std::min(bytes->val.size(), size_t(c.train.eval_batches * c.train.batch_size));
  std::vector<int64_t> in(size_t(c.model.context)), tg(size_t(c.model.context));
  double text_bytes = 0;
  for (size_t w = 0; w < total; ++w) {
    bytes->val.Fill(w, in.data(), tg.data());
    for (int64_t t : tg) text_bytes += t == 'e' ? 5 : 2;
  }
  const double tokens = double(total) * c.model.context;
  EXPECT_NEAR(as_shards.bits_per_byte, as_shards.bits * tokens / text_bytes, 1e-12);
  EXPECT_LT(as_shards.bits_per_byte, as_shards.bits / 2);
  // Shards without a tokenizer: bits per byte unknown.
  shards->token_bytes.clear();
  EXPECT_LT(Make(c, shards)->Evaluate()->bits_per_byte, 0);
}

TEST(TrainerTest, GradientAccumulationMatchesTheLargerBatch) {
  auto c = TinyConfig("");
  c.optim.grad_clip = 0;
  auto data = Data(c);
  auto big_cfg = c;
  big_cfg.train.batch_size = 8;
  auto acc_cfg = c;
  acc_cfg.train.grad_accum = 2;
  auto big = Make(big_cfg, data), acc = Make(acc_cfg, data);
  for (int i = 0; i < 3; ++i) {
    const auto sb = *big->Step(), sa = *acc->Step();
    EXPECT_NEAR(sb.loss, sa.loss, 1e-5);
  }
  auto pb = NamedParameters(*big->model()), pa = NamedParameters(*acc->model());
  for (size_t i = 0; i < pb.size(); ++i) {
    const auto& [name, b] = pb[i];
    const auto& a = pa[i].second;
    if (name.find("attn.qkv.bias") == std::string::npos) {
      EXPECT_TRUE(torch::allclose(b, a, 1e-4, 1e-6)) << name;
      continue;
    }
    // The key bias has an identically zero gradient: its value is rounding noise (~1e-6) that
    // AdamW amplifies, held to an absolute bound; the query and value biases as the rest.
    auto bs = b.view({3, -1}), as = a.view({3, -1});
    EXPECT_TRUE(torch::allclose(bs[0], as[0], 1e-4, 1e-6)) << name << " (query)";
    EXPECT_TRUE(torch::allclose(bs[2], as[2], 1e-4, 1e-6)) << name << " (value)";
    EXPECT_LT((bs[1] - as[1]).abs().max().item<double>(), 1e-5) << name << " (key)";
  }
}

TEST(TrainerTest, ImportStateRefusesAMismatchAndChangesNothing) {
  auto c = TinyConfig("");
  auto data = Data(c);
  auto t = Make(c, data);
  ASSERT_TRUE(t->Step().ok());
  const auto before = t->ExportState();
  auto bad = before;
  bad.tensors[1].shape = {3};
  bad.step = 99;
  EXPECT_EQ(t->ImportState(bad).code(), absl::StatusCode::kInvalidArgument);
  auto missing = before;
  missing.tensors.pop_back();
  EXPECT_EQ(t->ImportState(missing).code(), absl::StatusCode::kNotFound);
  const auto after = t->ExportState();
  EXPECT_EQ(after.step, 1);
  for (size_t i = 0; i < before.tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(before.tensors[i].values, after.tensors[i].values));
  }
}

TEST(TrainerTest, ExportImportContinuesBitIdentically) {
  for (auto name : {InnerOptimizerName::kAdamW, InnerOptimizerName::kMuon}) {
    SCOPED_TRACE(ConfigValueText(name));
    auto c = TinyConfig("");
    c.model.dropout = 0.1;  // exercises the RNG state
    c.optim.name = name;
    auto data = Data(c);
    auto a = Make(c, data);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->Step().ok());
    auto state = a->ExportState();
    std::vector<double> expected;
    for (int i = 0; i < 5; ++i) expected.push_back(a->Step()->loss);
    torch::manual_seed(12345);  // disturb the global generator
    auto b = Make(c, data);
    ASSERT_TRUE(b->ImportState(state).ok());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b->Step()->loss, expected[size_t(i)]) << i;
  }
}

// A checkpoint of one optimizer does not load into the other (its state lacks the other's
// kinds), and the refusal changes nothing.
TEST(TrainerTest, AnotherOptimizersStateIsRefused) {
  auto c = TinyConfig("");
  auto data = Data(c);
  auto adamw = Make(c, data);
  ASSERT_TRUE(adamw->Step().ok());
  c.optim.name = InnerOptimizerName::kMuon;
  auto muon = Make(c, data);
  ASSERT_TRUE(muon->Step().ok());
  const auto before = muon->ExportState();
  const auto refused = muon->ImportState(adamw->ExportState());
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("optim/momentum/blocks."));
  const auto after = muon->ExportState();
  ASSERT_EQ(after.tensors.size(), before.tensors.size());
  for (size_t i = 0; i < after.tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(after.tensors[i].values, before.tensors[i].values))
        << after.tensors[i].name;
  }
  EXPECT_EQ(muon->ImportState(before).code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace atl::inner
