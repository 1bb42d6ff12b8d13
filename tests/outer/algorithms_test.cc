// The outer algorithms without a service: outer optimizers, payload chunks, aggregation rules.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "compression/checksum.h"
#include "compression/codec.h"
#include "compression/codec_math.h"
#include "outer/base/aggregation.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/payload.h"

namespace atl::outer {
namespace {

using ::testing::HasSubstr;

TEST(OuterOptimizerTest, NesterovMatchesTheFormula) {
  NesterovOptimizer opt({0.7, 0.9, true}, 2);
  float g1[2] = {1.0f, -2.0f}, g2[2] = {0.5f, 0.25f}, u[2];
  opt.ComputeUpdate(g1, u);  // m = g1; u = lr (g1 + mu m)
  EXPECT_FLOAT_EQ(u[0], 0.7f * (1.0f + 0.9f * 1.0f));
  EXPECT_FLOAT_EQ(u[1], 0.7f * (-2.0f + 0.9f * -2.0f));
  opt.ComputeUpdate(g2, u);  // m = 0.9 g1 + g2
  const float m0 = 0.9f * 1.0f + 0.5f;
  EXPECT_FLOAT_EQ(u[0], 0.7f * (0.5f + 0.9f * m0));
}

// Every optimizer's traits (what eager updates and the planner know of it) agree with what it
// does: its first step from fresh state moves u = gain x g, and it says it is linear exactly when
// its traits do, at several momenta and with and without Nesterov.
TEST(OuterOptimizerTest, TraitsAgreeWithEachOptimizersSteps) {
  const float g[3] = {1.0f, -0.25f, 2.0f};
  for (const auto& name : OuterOptimizerNames()) {
    for (double momentum : {0.0, 0.5, 0.9}) {
      for (bool nesterov : {true, false}) {
        OuterOptimizerConfig c{0.5, momentum, nesterov};
        c.name = name;
        const auto& traits = TraitsOf(c);
        auto opt = MakeOuterOptimizer(c, 3);
        float u[3];
        opt->ComputeUpdate(g, u);
        const std::string what = absl::StrCat(name, " momentum ", momentum, nesterov ? " nesterov" : "");
        for (int i = 0; i < 3; ++i) EXPECT_NEAR(u[i], traits.gain(c) * g[i], 1e-6) << what;
        EXPECT_EQ(MakeOuterOptimizer(c, 3)->linear(), traits.linear(c)) << what;
      }
    }
  }
}

// Every optimizer, delayed Nesterov too, forgets what it learned on Restart (the step guard's
// restart): after a few steps and a restart it steps bit for bit as a fresh one.
TEST(OuterOptimizerTest, ARestartedOptimizerStepsAsAFreshOne) {
  const float g1[3] = {1.0f, -0.25f, 2.0f}, g2[3] = {-0.5f, 3.0f, 0.125f};
  for (const auto& name : OuterOptimizerNames()) {
    for (int delay : {0, 3}) {
      OuterOptimizerConfig c{0.5, 0.9, true};
      c.name = name;
      c.momentum_delay = delay;
      auto used = MakeOuterOptimizer(c, 3);
      float u[3], fresh[3];
      for (int step = 0; step < 2; ++step) used->ComputeUpdate(step % 2 ? g1 : g2, u);
      used->Restart();  // delayed: two gradients buffered, mid-period
      auto made = MakeOuterOptimizer(c, 3);
      for (int step = 0; step < 4; ++step) {
        used->ComputeUpdate(g1, u);
        made->ComputeUpdate(g1, fresh);
        EXPECT_EQ(0, std::memcmp(u, fresh, sizeof(u)))
            << name << " delay " << delay << " step " << step;
      }
    }
  }
}

// Outer optimizers by name, with their named state: sgd keeps none and steps u = lr g, bit for
// bit what nesterov at momentum 0 steps; nesterov's state round-trips through Restore by name.
TEST(OuterOptimizerTest, ChosenByNameWithNamedState) {
  OuterOptimizerConfig c{0.7, 0.0, true};
  c.name = "sgd";
  auto sgd = MakeOuterOptimizer(c, 3);
  ASSERT_NE(sgd, nullptr);
  EXPECT_STREQ(sgd->name(), "sgd");
  EXPECT_TRUE(sgd->StateTensors().empty());
  c.name = "nesterov";
  auto nesterov = MakeOuterOptimizer(c, 3);
  float g[3] = {1.0f, -0.3f, 2.5f}, a[3], b[3];
  sgd->ComputeUpdate(g, a);
  nesterov->ComputeUpdate(g, b);
  EXPECT_EQ(0, std::memcmp(a, b, sizeof(a)));
  EXPECT_EQ(OuterOptimizerNames(), (std::vector<std::string>{"nesterov", "sgd"}));
  c.name = "adam";
  EXPECT_FALSE(Validate(c).ok());

  OuterOptimizerConfig d{0.7, 0.9, true};
  d.momentum_delay = 3;
  auto delayed = MakeOuterOptimizer(d, 3);
  delayed->ComputeUpdate(g, a);
  const auto tensors = delayed->StateTensors();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "momentum");
  EXPECT_EQ(tensors[1].name, "buffer");
  ASSERT_EQ(delayed->StateCounters().size(), 1u);
  EXPECT_EQ(delayed->StateCounters()[0], (std::pair<std::string, int64_t>{"buffered", 1}));
  auto copy = MakeOuterOptimizer(d, 3);
  std::vector<std::pair<std::string, std::vector<float>>> state;
  for (const auto& t : tensors) state.emplace_back(t.name, *t.values);
  ASSERT_TRUE(copy->Restore(state, delayed->StateCounters()).ok());
  delayed->ComputeUpdate(g, a);
  copy->ComputeUpdate(g, b);
  EXPECT_EQ(0, std::memcmp(a, b, sizeof(a)));
  // All or nothing, by name and size.
  state[1].first = "velocity";
  EXPECT_THAT(std::string(copy->Restore(state, {{"buffered", 0}}).message()), HasSubstr("velocity"));
  EXPECT_FALSE(sgd->Restore(state, {}).ok());
}

TEST(OuterOptimizerTest, PlainSgdAndHeavyBall) {
  NesterovOptimizer sgd({1.0, 0.0, false}, 1);
  float g[1] = {3.0f}, u[1];
  sgd.ComputeUpdate(g, u);
  EXPECT_EQ(u[0], 3.0f);
  EXPECT_TRUE(sgd.momentum().empty());
  NesterovOptimizer heavy({0.5, 0.5, false}, 1);
  heavy.ComputeUpdate(g, u);
  heavy.ComputeUpdate(g, u);  // m = 0.5 * 3 + 3
  EXPECT_EQ(u[0], 0.5f * 4.5f);
  EXPECT_FALSE(Validate(OuterOptimizerConfig{0.0, 0.9, true}).ok());
  EXPECT_FALSE(Validate(OuterOptimizerConfig{0.7, 1.0, true}).ok());
}

TEST(OuterOptimizerTest, LearningRateScheduleWarmsUpThenDecays) {
  OuterOptimizerConfig c{0.8, 0.9, true};
  EXPECT_EQ(ScheduledLr(c, 0, 10), 0.8);  // constant by default
  EXPECT_EQ(ScheduledLr(c, 9, 10), 0.8);
  c.warmup_rounds = 3;
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 0, 10), 0.2);
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 2, 10), 0.6);
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 3, 10), 0.8);
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 9, 10), 0.8);
  c.decay = LrDecay::kCosine;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 3, 12), 0.8);          // the first round after warmup
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 7, 12), 0.8 * 0.55);   // half way: (0.1 + 1) / 2
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 11, 12), 0.8 * 0.1);   // the last round
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 20, 12), 0.8 * 0.1);   // past the end (a longer resumed run)
  EXPECT_DOUBLE_EQ(ScheduledLr(c, 5, 0), 0.8);           // no known length: no decay
  EXPECT_FALSE(ParseConfigValue("linear", &c.decay).ok());
}

TEST(OuterOptimizerTest, DelayedNesterovWithPeriodOneIsNesterovBitForBit) {
  OuterOptimizerConfig plain{0.7, 0.9, true};
  OuterOptimizerConfig delayed = plain;
  delayed.momentum_delay = 1;
  NesterovOptimizer a(plain, 1000), b(delayed, 1000);
  for (int step = 0; step < 10; ++step) {
    std::vector<float> g(1000), ua(1000), ub(1000);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(float(i * 7 + step)) * 1e-3f;
    a.ComputeUpdate(g.data(), ua.data());
    b.ComputeUpdate(g.data(), ub.data());
    ASSERT_EQ(0, std::memcmp(ua.data(), ub.data(), ua.size() * 4)) << "step " << step;
  }
  EXPECT_EQ(0, std::memcmp(a.momentum().data(), b.momentum().data(), 1000 * 4));
}

TEST(OuterOptimizerTest, DelayedNesterovStepsTheMomentumEveryNthGradient) {
  OuterOptimizerConfig c{0.5, 0.5, true};
  c.momentum_delay = 2;
  NesterovOptimizer opt(c, 1);
  float g1[1] = {2.0f}, g2[1] = {4.0f}, g3[1] = {8.0f}, u[1];
  opt.ComputeUpdate(g1, u);  // buffered: u = lr g / N
  EXPECT_EQ(u[0], 0.5f * 1.0f);
  EXPECT_EQ(opt.momentum()[0], 0.0f);
  opt.ComputeUpdate(g2, u);  // m = mu 0 + (2 + 4) / 2 = 3; u = lr (4 / 2 + mu 3)
  EXPECT_EQ(opt.momentum()[0], 3.0f);
  EXPECT_EQ(u[0], 0.5f * (2.0f + 0.5f * 3.0f));
  opt.ComputeUpdate(g3, u);  // buffer cleared: u = lr 8 / 2
  EXPECT_EQ(u[0], 0.5f * 4.0f);
  EXPECT_EQ(opt.momentum()[0], 3.0f);
  EXPECT_FALSE(Validate(OuterOptimizerConfig{0.7, 0.9, true, -1}).ok());
}

// The service previews an update to check it before committing to it: previewing changes nothing.
TEST(OuterOptimizerTest, PreviewChangesNoStateAndMatchesTheUpdate) {
  OuterOptimizerConfig delayed{0.7, 0.9, true};
  delayed.momentum_delay = 3;
  for (const OuterOptimizerConfig& c : {OuterOptimizerConfig{1.0, 0.0, false},
                                        OuterOptimizerConfig{0.5, 0.5, false},
                                        OuterOptimizerConfig{0.7, 0.9, true}, delayed}) {
    NesterovOptimizer opt(c, 64);
    for (int step = 0; step < 7; ++step) {
      std::vector<float> g(64), u1(64), u2(64), u3(64);
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(float(i * 3 + step));
      const auto m = opt.momentum();
      const auto b = opt.buffer();
      const int buffered = opt.buffered();
      opt.Preview(g.data(), u1.data(), 0, g.size());
      opt.Preview(g.data(), u2.data(), 0, g.size());
      EXPECT_EQ(opt.momentum(), m);
      EXPECT_EQ(opt.buffer(), b);
      EXPECT_EQ(opt.buffered(), buffered);
      EXPECT_EQ(u1, u2);
      opt.ComputeUpdate(g.data(), u3.data());
      EXPECT_EQ(0, std::memcmp(u1.data(), u3.data(), 64 * 4)) << "step " << step;
    }
  }
}

// A warm-start round is a plain average: u = g, and the momentum (Nesterov's, delayed Nesterov's
// buffer) is left as it was, so the rounds after it step as if it had not happened.
TEST(OuterOptimizerTest, AveragingStepsLeaveTheMomentumAlone) {
  OuterOptimizerConfig delayed{0.7, 0.9, true};
  delayed.momentum_delay = 2;
  for (const OuterOptimizerConfig& c : {OuterOptimizerConfig{0.7, 0.9, true}, delayed}) {
    NesterovOptimizer warmed(c, 8), fresh(c, 8);
    std::vector<float> g(8), u(8), expected(8);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * float(i) - 1.0f;
    warmed.set_averaging(true);
    warmed.set_lr(1.0);
    for (int step = 0; step < 3; ++step) {
      warmed.ComputeUpdate(g.data(), u.data());
      EXPECT_EQ(u, g) << "step " << step;
    }
    EXPECT_EQ(warmed.momentum(), fresh.momentum());
    EXPECT_EQ(warmed.buffered(), 0);
    warmed.set_averaging(false);
    warmed.set_lr(0.7);
    for (int step = 0; step < 3; ++step) {
      warmed.ComputeUpdate(g.data(), u.data());
      fresh.ComputeUpdate(g.data(), expected.data());
      EXPECT_EQ(u, expected) << "step " << step;
    }
  }
}

// Encodes values as the service keeps a contribution (fp32 chunks of 3 elements: windows and chunk
// boundaries do not line up).
EncodedPayload Encoded(const std::vector<float>& v) {
  ChunkStream stream({"run", "x", 0, 0}, {compression::Codec::kFp32, 0}, v.size());
  auto chunks = EncodeChunks({"run", "x", 0, 0}, {compression::Codec::kFp32, 0}, v.data(), 0,
                             v.size(), v.size(), 12);
  EXPECT_TRUE(chunks.ok());
  for (auto& c : *chunks) EXPECT_TRUE(stream.Add(std::move(c)).ok());
  return std::move(stream).Take();
}

// A non-finite value is named by its element of the fragment, not of its chunk: chunks of 3
// elements, a NaN at element 7 (the second of the third chunk).
TEST(PayloadTest, ANonFiniteValueIsNamedByItsFragmentElement) {
  std::vector<float> v(12, 1.0f);
  v[7] = std::nanf("");
  ChunkStream stream({"run", "x", 0, 0}, {compression::Codec::kFp32, 0}, v.size());
  std::vector<float> clean(12, 1.0f);
  auto chunks = *EncodeChunks({"run", "x", 0, 0}, {compression::Codec::kFp32, 0}, clean.data(), 0,
                              v.size(), v.size(), 12);
  std::memcpy(chunks[2].mutable_data()->data() + 4, &v[7], 4);
  chunks[2].set_xxh64(compression::Checksum(chunks[2].data().data(), chunks[2].data().size()));
  absl::Status s;
  for (auto& c : chunks) {
    s = stream.Add(std::move(c));
    if (!s.ok()) break;
  }
  if (s.ok()) s = Measure(std::move(stream).Take()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("non-finite value at element 7")) << s;
}

// A rank receives the slice of an update chunk that holds its range, exactly: the slice decodes to
// the same values as the whole chunk, on whole scale blocks around the range.
TEST(PayloadTest, SlicesOfAChunkDecodeToTheSameValues) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i) * 0.37f);
  for (const char* name : {"fp32", "bf16", "int8", "fp4_e2m1", "fp4_e3m0"}) {
    const auto spec = *compression::ParseCodec(name);
    // One chunk holding elements [100, 1100) of a 2000-element fragment.
    auto chunks = *EncodeChunks({"run", "", 0, 0}, spec, v.data(), 100, 1000, 2000, 1 << 20);
    ASSERT_EQ(chunks.size(), 1u);
    std::vector<float> all(1000);
    ASSERT_TRUE(compression::Decode(spec, reinterpret_cast<const uint8_t*>(chunks[0].data().data()),
                                    chunks[0].data().size(), 1000, all.data()).ok());
    for (auto [first, last] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, 2000}, {100, 1100}, {350, 351}, {333, 777}, {1090, 1500}, {50, 101}}) {
      const pb::Chunk s = SliceChunk(chunks[0], first, last);
      const auto& h = s.header();
      EXPECT_LE(h.offset(), std::max<uint64_t>(first, 100)) << name;
      EXPECT_GE(h.offset() + h.num_elements(), std::min<uint64_t>(last, 1100)) << name;
      EXPECT_LT(h.num_elements(), std::min<uint64_t>(last, 1100) - std::max<uint64_t>(first, 100) +
                                      2 * std::max<uint32_t>(1, spec.block_size)) << name;
      Assembler a({"run", "", 0, 0}, 2000, h.offset(), h.num_elements(), spec);
      ASSERT_TRUE(a.Add(s).ok()) << name << " [" << first << ", " << last << ")";
      for (uint64_t k = 0; k < h.num_elements(); ++k) {
        ASSERT_EQ(a.values()[k], all[h.offset() - 100 + k]) << name << " element " << k;
      }
    }
  }
}

// The sampled quantization error equals the error computed over the same elements by hand, is 0
// for fp32, and for FP4 of Gaussian-like values lands where E2M1's 3 bits put it.
TEST(PayloadTest, SampledEncodingErrorIsTheErrorOfTheSampledElements) {
  std::vector<float> v(50000);
  uint64_t state = 7;
  for (auto& x : v) {  // a sum of uniforms: roughly Gaussian
    double sum = 0;
    for (int k = 0; k < 4; ++k) sum += double(compression::math::Mix64(++state) >> 11) / 9007199254740992.0;
    x = float(sum - 2.0);
  }
  for (const char* name : {"fp32", "fp4_e2m1"}) {
    const auto spec = *compression::ParseCodec(name);
    // Elements [1000, 51000) of a fragment, in chunks of 4 KiB.
    auto chunks = *EncodeChunks({"run", "", 0, 0}, spec, v.data(), 1000, v.size(), 60000, 4096);
    ASSERT_GT(chunks.size(), 4u);
    EncodingError sampled;
    ASSERT_TRUE(SampleEncodingError(chunks, v.data(), 1000, 3000, &sampled).ok());
    EXPECT_LE(sampled.elements, 3000u);
    EXPECT_GE(sampled.elements, 3000u - chunks.size());
    // By hand: the first elements of each chunk, fully decoded.
    double err = 0, ref = 0;
    const uint64_t per_chunk = 3000 / chunks.size();
    for (const auto& c : chunks) {
      const auto& h = c.header();
      std::vector<float> all(h.num_elements());
      ASSERT_TRUE(compression::Decode(spec, reinterpret_cast<const uint8_t*>(c.data().data()),
                                      c.data().size(), all.size(), all.data()).ok());
      for (uint64_t i = 0; i < std::min<uint64_t>(per_chunk, all.size()); ++i) {
        const double x = v[h.offset() - 1000 + i];
        err += (all[i] - x) * (all[i] - x);
        ref += x * x;
      }
    }
    EXPECT_NEAR(sampled.relative(), std::sqrt(err / ref), 1e-9) << name;
    if (std::string(name) == "fp32") EXPECT_EQ(sampled.relative(), 0.0);
    if (std::string(name) == "fp4_e2m1") {
      EXPECT_GT(sampled.relative(), 0.05);
      EXPECT_LT(sampled.relative(), 0.3);
    }
  }
}

TEST(AggregationTest, RulesAreTheirFormulasCoordinateWise) {
  const std::vector<std::vector<float>> v = {{1, 10, -2}, {2, 20, -2}, {3, -30, 0}, {100, 0, -2}};
  std::vector<EncodedPayload> payloads;
  for (const auto& x : v) payloads.push_back(Encoded(x));
  std::vector<ContributionRef> refs;
  const char* names[] = {"a", "b", "c", "d"};
  const uint64_t tokens[] = {1, 1, 2, 4};
  for (int i = 0; i < 4; ++i) {
    double norm = 0;
    for (float x : v[size_t(i)]) norm += double(x) * x;
    refs.push_back({names[i], tokens[i], std::sqrt(norm), &payloads[size_t(i)]});
  }
  auto agg = [&](AggregationOptions o, AggregationReport* report = nullptr) {
    std::vector<float> out(3);
    EXPECT_TRUE(Aggregate(o, refs, 3, out.data(), report).ok());
    return out;
  };
  AggregationOptions o;
  EXPECT_EQ(agg(o), (std::vector<float>{409.0f / 8, -30.0f / 8, -12.0f / 8}));  // token-weighted
  o.rule = AggregationRule::kMedian;  // middle two of four, unweighted
  AggregationReport median_report;
  EXPECT_EQ(agg(o, &median_report), (std::vector<float>{2.5f, 5.0f, -2.0f}));
  EXPECT_EQ(median_report.trimmed.size(), 4u);
  o.rule = AggregationRule::kTrimmedMean;
  o.trim_fraction = 0.2;  // floor(0.8) = 0: the unweighted mean
  EXPECT_EQ(agg(o), (std::vector<float>{26.5f, 0.0f, -1.5f}));
  o.trim_fraction = 0.25;
  EXPECT_EQ(agg(o), (std::vector<float>{2.5f, 5.0f, -2.0f}));
  // clipped_mean: d's norm (100.02) is far above 2 x the median norm; it is scaled down to it.
  o.rule = AggregationRule::kClippedMean;
  AggregationReport report;
  const auto clipped = agg(o, &report);
  EXPECT_EQ(report.clipped, std::vector<std::string>{"d"});
  EXPECT_LT(clipped[0], 30.0f);
  EXPECT_GT(clipped[0], 2.0f);
}

TEST(AggregationTest, DeterministicAcrossWindowsAndNamesTheOutlier) {
  // 10,000 elements span several decoding windows; one island flips and triples its values.
  const size_t n = 10000;
  std::vector<EncodedPayload> payloads;
  std::vector<ContributionRef> refs;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> x(n);
    for (size_t j = 0; j < n; ++j) {
      x[j] = std::sin(float(j)) + 0.01f * std::sin(float(j * 7919 + size_t(i) * 104729));
    }
    if (i == 2) {
      for (float& e : x) e *= -3.0f;
    }
    payloads.push_back(Encoded(x));
  }
  for (int i = 0; i < 5; ++i) {
    refs.push_back({std::string(1, char('a' + i)), 1, 1.0, &payloads[size_t(i)]});
  }
  AggregationOptions o;
  o.rule = AggregationRule::kMedian;
  AggregationReport report;
  std::vector<float> out(n), again(n);
  ASSERT_TRUE(Aggregate(o, refs, n, out.data(), &report).ok());
  std::reverse(refs.begin(), refs.end());  // a different order of the same islands...
  std::sort(refs.begin(), refs.end(),
            [](const auto& x, const auto& y) { return x.island < y.island; });  // ...sorted again
  ASSERT_TRUE(Aggregate(o, refs, n, again.data(), nullptr).ok());
  EXPECT_EQ(out, again);
  EXPECT_EQ(report.outliers, std::vector<std::string>{"c"});
  EXPECT_GT(report.trimmed["c"], 0.9);
  for (size_t j = 0; j < n; j += 997) EXPECT_NEAR(out[j], std::sin(float(j)), 0.011f);
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(int(i % 97) - 48);
  return v;
}

TEST(PayloadTest, ChunksRoundTripBitExact) {
  const auto values = Ramp(10000, 0.001f);
  PayloadId id{"run", "a", 3, 0};
  auto chunks = EncodeChunks(id, {compression::Codec::kFp32, 0}, values.data(), 0, 10000, 10000,
                             4096);  // 1024 floats per chunk
  ASSERT_TRUE(chunks.ok());
  ASSERT_EQ(chunks->size(), 10u);
  Assembler a(id, 10000, 0, 10000);
  for (auto it = chunks->rbegin(); it != chunks->rend(); ++it) ASSERT_TRUE(a.Add(*it).ok());
  ASSERT_TRUE(a.complete());
  EXPECT_EQ(a.values(), values);
}

TEST(PayloadTest, RefusesBadChunksAndStaysUntouched) {
  const auto values = Ramp(100, 1.0f);
  PayloadId id{"run", "a", 3, 0};
  auto chunks = *EncodeChunks(id, {compression::Codec::kFp32, 0}, values.data(), 0, 100, 100, 200);
  Assembler a(id, 100, 0, 100);
  ASSERT_TRUE(a.Add(chunks[0]).ok());
  auto dup = a.Add(chunks[0]);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);

  auto corrupt = chunks[1];
  corrupt.mutable_data()->at(5) ^= 1;
  auto s = a.Add(corrupt);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum mismatch"));

  auto short_data = chunks[1];
  short_data.mutable_data()->resize(8);
  short_data.set_xxh64(compression::Checksum(short_data.data().data(), 8));
  EXPECT_THAT(std::string(a.Add(short_data).message()), HasSubstr("need 200 bytes, got 8"));

  auto nan = chunks[1];
  const float bad = std::nanf("");
  std::memcpy(nan.mutable_data()->data(), &bad, 4);
  nan.set_xxh64(compression::Checksum(nan.data().data(), nan.data().size()));
  EXPECT_THAT(std::string(a.Add(nan).message()), HasSubstr("non-finite"));

  auto range = chunks[1];
  range.mutable_header()->set_offset(90);
  EXPECT_EQ(a.Add(range).code(), absl::StatusCode::kInvalidArgument);
  auto run = chunks[1];
  run.mutable_header()->set_run_id("other");
  EXPECT_EQ(a.Add(run).code(), absl::StatusCode::kNotFound);
  auto codec = chunks[1];
  codec.mutable_header()->set_codec(pb::Codec(42));
  EXPECT_THAT(std::string(a.Add(codec).message()), HasSubstr("unsupported codec"));

  EXPECT_FALSE(a.complete());
  EXPECT_THAT(std::string(a.CheckComplete().message()), HasSubstr("50 of 100"));
  ASSERT_TRUE(a.Add(chunks[1]).ok());
  EXPECT_EQ(a.values(), values);
  std::vector<float> inf = {1.0f, INFINITY};
  EXPECT_FALSE(EncodeChunks(id, {compression::Codec::kFp32, 0}, inf.data(), 0, 2, 2).ok());
}

}  // namespace
}  // namespace atl::outer
