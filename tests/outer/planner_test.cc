#include "outer/base/planner.h"

#include <cmath>

#include <gtest/gtest.h>

#include "compression/codec.h"
#include "outer/service/auto_tune.h"

namespace atl::outer {
namespace {

using compression::Codec;
using compression::CodecSpec;

constexpr CodecSpec kBf16 = {Codec::kBf16, 0};
constexpr CodecSpec kFp32 = {Codec::kFp32, 0};

// Table 4 of the Streaming DiLoCo paper: 1B parameters, 0.1 s per step, 2 islands, H = 100,
// 16-bit payloads, 8 fragments of 3 layers, an all-reduce overlapped with the backward pass.
PlanInput PaperCase(PlanMethod method, int fragments, int tau, CodecSpec codec) {
  PlanInput in;
  in.fragment_elements.assign(size_t(fragments), uint64_t(1'000'000'000) / uint64_t(fragments));
  in.step_time_s = 0.1;
  in.islands = 2;
  in.method = method;
  in.topology = PlanTopology::kRing;
  in.sync_every = 100;
  in.tau = tau;
  in.codec = codec;
  return in;
}

double Required(const PlanInput& in, double target) {
  auto bps = RequiredBandwidth(in, target);
  EXPECT_TRUE(bps.ok()) << bps.status();
  return bps.ok() ? *bps : 0;
}

TEST(PlannerTest, ReproducesTheOrdersOfMagnitudeOfTheStreamingDiLoCoPaper) {
  // Data parallel: 2e9 bytes all-reduced every step, within 0.1 / 0.95 - 0.1 / 3 s.
  const double dp = Required(PaperCase(PlanMethod::kDataParallel, 1, 0, kBf16), 0.95);
  EXPECT_NEAR(dp / 1e9, 16.0 / (0.1 / 0.95 - 0.1 / 3), 0.5);  // 222.5; the paper: 222.3
  const double diloco = Required(PaperCase(PlanMethod::kDiLoCo, 1, 0, kBf16), 0.95);
  const double streaming = Required(PaperCase(PlanMethod::kStreaming, 8, 0, kBf16), 0.95);
  const double overlap = Required(PaperCase(PlanMethod::kStreaming, 8, 1, kBf16), 0.95);
  const double fp4 =
      Required(PaperCase(PlanMethod::kStreaming, 8, 1, {Codec::kFp4E2M1, 32}), 0.95);
  // The paper: 23.3, 16.0, 9.1 and 2.0 Gbit/s.
  EXPECT_GT(diloco, 15e9);
  EXPECT_LT(diloco, 35e9);
  EXPECT_LT(streaming, diloco);
  EXPECT_LT(overlap, streaming);
  EXPECT_GT(overlap, 5e9);
  EXPECT_LT(overlap, 15e9);
  EXPECT_GT(fp4, 1e9);
  EXPECT_LT(fp4, 3e9);
  EXPECT_LT(fp4 * 50, dp);  // about two orders of magnitude below data parallel (the paper: 111x)
  // Sparse 2-bit pseudo-gradients (1% of each chunk of 4096, int2), all-gathered on the ring:
  // at most 0.2 Gbit/s, a thirtieth of FP4's.
  const double sparse =
      Required(PaperCase(PlanMethod::kStreaming, 8, 1, {Codec::kInt2, 4096, 41}), 0.95);
  EXPECT_LT(sparse, 0.2e9);
  EXPECT_LT(sparse * 30, fp4);
}

// Through the star a sparse run's update comes back relayed when the outer step is linear (an
// island receives the M - 1 other pushes: outer/base/update_recipe.h), else as the union of the
// islands' indices (FP4 values): at most M times a push's kept values, never more than dense FP4.
TEST(PlannerTest, SparseUpdatesComeBackRelayedOrAsTheUnionOfThePushes) {
  PlanInput in;
  in.fragment_elements = {1 << 20};
  in.islands = 4;
  in.codec = {Codec::kInt2, 4096, 41};
  const double push = double(compression::EncodedBytes(in.codec, 1 << 20));
  const double dense_fp4 = double(compression::EncodedBytes({Codec::kFp4E2M1, 32}, 1 << 20));
  const PlanResult relayed = Simulate(in);
  EXPECT_EQ(relayed.bytes_sent_per_round, push);
  EXPECT_EQ(relayed.bytes_received_per_round, 3 * push);
  in.linear_outer_step = false;
  const PlanResult r = Simulate(in);
  EXPECT_GT(r.bytes_received_per_round, 3 * push);
  EXPECT_LT(r.bytes_received_per_round, dense_fp4 / 4);
  in.islands = 100;  // the union would take more than dense FP4, and so would 99 pushes
  EXPECT_EQ(Simulate(in).bytes_received_per_round, dense_fp4);
  in.linear_outer_step = true;
  EXPECT_EQ(Simulate(in).bytes_received_per_round, dense_fp4);
}

// One fragment of 1M parameters in fp32 (4 MB), 0.05 s per step, H = 20 (1 s of compute per
// round), no commit time: on a 32 Mbit/s link the push and the update take 1 s each.
PlanInput OneFourMegabyteRound() {
  PlanInput in;
  in.fragment_elements = {1'000'000};
  in.step_time_s = 0.05;
  in.sync_every = 20;
  in.codec = kFp32;
  in.commit_s_per_param = 0;
  in.link.bandwidth_bps = 32e6;
  return in;
}

// Four 1 MB fragments (fp32), H = 40, 0.1 s per step, 16 Mbit/s: a fragment's round trip is 10
// steps; blocking idles half the time, tau = 10 hides it all, tau = 9 leaves 0.1 s per fragment.
PlanInput FourFragments() {
  PlanInput in;
  in.fragment_elements.assign(4, 250'000);
  in.method = PlanMethod::kStreaming;
  in.sync_every = 40;
  in.codec = kFp32;
  in.commit_s_per_param = 0;
  in.step_time_s = 0.1;
  in.link.bandwidth_bps = 16e6;
  return in;
}

TEST(PlannerTest, BlockingDiLoCoThroughTheServiceWaitsForThePushAndTheUpdate) {
  PlanInput in = OneFourMegabyteRound();
  const PlanResult r = Simulate(in);
  EXPECT_NEAR(r.utilization, 1.0 / (1.0 + 2.0), 1e-9);
  EXPECT_DOUBLE_EQ(r.bytes_sent_per_round, 4e6);
  EXPECT_DOUBLE_EQ(r.bytes_received_per_round, 4e6);
  EXPECT_EQ(r.peak_bytes_in_flight, uint64_t(4e6));
  EXPECT_NEAR(r.bytes_per_hour, 8e6 * 3600 / 3.0, 1e-3);

  // Latency: push, acknowledgement, the wait's request, the update: four one-way trips.
  in.link.latency_s = 0.25;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + 2.0 + 1.0), 1e-9);
  // The service's commit adds its time for every island.
  in.link.latency_s = 0;
  in.commit_s_per_param = 1e-7;
  in.islands = 5;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + 2.0 + 0.5), 1e-9);
}

// A sparse round under a linear outer step commits in the values kept (4096 / 4096 x 41 = 10,010
// per island here), not in the parameters; under a momentum step it is a dense commit.
TEST(PlannerTest, ASparseCommitCostsItsKeptValues) {
  PlanInput in = OneFourMegabyteRound();
  in.codec = {compression::Codec::kInt2, 4096, 41};
  in.link.bandwidth_bps = 1e15;  // transfers take no time
  in.islands = 5;
  in.commit_s_per_param = 1e-7;  // dense: 0.5 s
  in.sparse_commit_s_per_value = 4e-6;
  const double kept = 1'000'000.0 / 4096 * 41 * 5;
  in.linear_outer_step = true;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + kept * 4e-6), 1e-6);
  in.linear_outer_step = false;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + 0.5), 1e-6);
}

TEST(PlannerTest, TheServicesThreadsAndShardsShortenItsCommits) {
  // A commit of 0.5 s on one thread (1M parameters x 5 islands x 1e-7 s).
  PlanInput in = OneFourMegabyteRound();
  in.commit_s_per_param = 1e-7;
  in.islands = 5;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + 2.0 + 0.5), 1e-9);
  // 4 threads, 76% of it parallel: 0.5 x (0.24 + 0.76 / 4) = 0.215 s.
  in.service_threads = 4;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + 2.0 + 0.215), 1e-9);
  in.commit_parallel_fraction = 1;
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / (1.0 + 2.0 + 0.125), 1e-9);

  // Shards: four fragments pushed a step apart (H = 4, tau = 3) whose commits take 0.25 s each (the
  // links are fast): one shard commits them one after another, 1 s of commits for every 0.4 s of
  // compute; four shards commit each within the 0.3 s that tau leaves it.
  PlanInput s = FourFragments();
  s.sync_every = 4;
  s.tau = 3;
  s.link.bandwidth_bps = 1e12;
  s.commit_s_per_param = 0.25 / (250'000.0 * s.islands);
  const double one = Simulate(s).utilization;
  s.shards = 4;
  const double four = Simulate(s).utilization;
  EXPECT_NEAR(one, 0.4, 0.01);
  EXPECT_GT(four, 0.999);
  s.shards = 0;
  EXPECT_FALSE(ValidatePlanInput(s).ok());
}

TEST(PlannerTest, IslandsShareTheServicesLink) {
  PlanInput in = OneFourMegabyteRound();
  in.islands = 4;
  in.link.bandwidth_bps = 1e9;
  in.service_bandwidth_bps = 128e6;  // 32 Mbit/s each: 4 MB up in 1 s, down in 1 s
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / 3.0, 1e-9);
  in.islands = 8;  // twice the islands, half the share
  EXPECT_NEAR(Simulate(in).utilization, 1.0 / 5.0, 1e-9);
  in.topology = PlanTopology::kRing;  // no service: the islands' own links
  EXPECT_GT(Simulate(in).utilization, 0.9);
  in.topology = PlanTopology::kStar;
  auto need = RequiredBandwidth(in, 0.95);
  EXPECT_TRUE(absl::IsOutOfRange(need.status())) << need.status();
  EXPECT_NE(need.status().message().find("leaves each of the 8 islands 16.0 Mbit/s"),
            std::string::npos) << need.status();
}

TEST(PlannerTest, OverlapHidesTransfersThatFitInTauSteps) {
  PlanInput in = FourFragments();
  in.tau = 0;
  const double blocking = Simulate(in).utilization;
  EXPECT_NEAR(blocking, 4.0 / (4.0 + 4 * 1.0), 1e-9);
  in.tau = 9;  // one step short
  EXPECT_NEAR(Simulate(in).utilization, 4.0 / (4.0 + 4 * 0.1), 1e-9);
  in.tau = 10;
  const PlanResult hidden = Simulate(in);
  EXPECT_NEAR(hidden.utilization, 1.0, 1e-9);
  // One fragment in flight at a time: the peak is one fragment's payload, not the model's.
  EXPECT_EQ(hidden.peak_bytes_in_flight, uint64_t(1e6));
  // Fragments due closer together than their transfers queue on the link.
  in.sync_every = 12;  // a fragment every 3 steps, each needing 5 steps of link each way
  in.tau = 11;
  EXPECT_LT(Simulate(in).utilization, 0.9);
}

TEST(PlannerTest, AFiniteRunEndsWithEveryFragmentSyncedInTurn) {
  PlanInput in;
  in.fragment_elements.assign(2, 500'000);  // 2 MB each in fp32
  in.method = PlanMethod::kStreaming;
  in.step_time_s = 0.1;
  in.sync_every = 10;
  in.tau = 4;
  in.codec = kFp32;
  in.commit_s_per_param = 0;
  in.link.bandwidth_bps = 80e6;  // 0.2 s each way
  in.steps = 10;
  // Fragment 1 is pushed after step 5 and merged after step 9, just in time; after step 10 both
  // fragments are pushed and merged one after the other.
  const PlanResult r = Simulate(in);
  EXPECT_EQ(r.steps, 10);
  EXPECT_NEAR(r.wall_s, 1.0 + 2 * 0.4, 1e-9);
  EXPECT_NEAR(r.utilization, 1.0 / 1.8, 1e-9);
}

// A warm start blocks on a round after every step (every fragment, tau 0): a run that is all warm
// start is a run with H = 1; a streaming run with one first waits longer than without.
TEST(PlannerTest, AWarmStartWaitsForARoundEveryStep) {
  PlanInput in = OneFourMegabyteRound();
  in.steps = 12;
  in.sync_every = 4;
  in.phases.warm_start_steps = 12;
  PlanInput every_step = in;
  every_step.sync_every = 1;
  every_step.phases = {};
  EXPECT_DOUBLE_EQ(Simulate(in).wall_s, Simulate(every_step).wall_s);
  in.phases = {};
  EXPECT_LT(Simulate(in).wall_s, Simulate(every_step).wall_s);

  PlanInput streaming = FourFragments();
  streaming.steps = 40;
  const PlanResult plain = Simulate(streaming);
  streaming.phases.warm_start_steps = 8;
  EXPECT_LT(Simulate(streaming).utilization, plain.utilization);
  EXPECT_EQ(Simulate(streaming).steps, 40);
}

// Fragments pushed after the same step share the link: two of 0.1 s each both arrive after
// 0.2 s, so the first update starts down only then. A warm-start step of two fragments (80 Mbit/s,
// 1 MB each, no commit time): pushes end at 0.3 s, updates at 0.4 and 0.5 s; then the run's end
// pushes and merges each in turn (0.2 s each): 0.1 + 0.4 + 0.1 + 0.4 = 1.0 s, where a link that
// sent one push after the other would have had the first update down by 0.3 s (0.9 s in all).
TEST(PlannerTest, FragmentsPushedTogetherShareTheLink) {
  PlanInput in;
  in.fragment_elements = {250'000, 250'000};
  in.method = PlanMethod::kStreaming;
  in.codec = kFp32;
  in.step_time_s = 0.1;
  in.sync_every = 2;
  in.commit_s_per_param = 0;
  in.link.bandwidth_bps = 80e6;
  in.steps = 2;
  in.phases.warm_start_steps = 1;
  EXPECT_NEAR(Simulate(in).wall_s, 1.0, 1e-9);
}

TEST(PlannerTest, OneTcpStreamCarriesItsWindowPerRoundTrip) {
  PlanInput in;
  in.fragment_elements = {1'000'000'000};
  in.codec = {Codec::kFp4E2M1, 32};
  in.method = PlanMethod::kDiLoCo;
  in.sync_every = 100;
  in.step_time_s = 0.1;
  in.link.latency_s = 0.05;  // RTT 100 ms: 4 MiB per 100 ms = 335.5 Mbit/s per connection
  in.link.bandwidth_bps = 100e9;
  in.commit_s_per_param = 0;
  EXPECT_NEAR(in.link.RateBps(), 8.0 * (4 << 20) / 0.1, 1);
  auto one = RequiredBandwidth(in, 0.9);
  EXPECT_TRUE(absl::IsOutOfRange(one.status())) << one.status();
  EXPECT_NE(one.status().message().find("1 TCP connection(s) carry 335.5 Mbit/s"), std::string::npos);
  in.link.connections = 64;
  auto many = RequiredBandwidth(in, 0.9);
  ASSERT_TRUE(many.ok()) << many.status();
  in.link.bandwidth_bps = *many;
  EXPECT_GE(Simulate(in).utilization, 0.9);
  in.link.bandwidth_bps = *many * 0.99;
  EXPECT_LT(Simulate(in).utilization, 0.9);
}

TEST(PlannerTest, RefusesWhatItCannotModel) {
  PlanInput in;
  in.fragment_elements = {100};
  EXPECT_TRUE(ValidatePlanInput(in).ok());
  auto refused = [](PlanInput bad, const std::string& words) {
    const auto s = ValidatePlanInput(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(words), std::string::npos) << s;
  };
  PlanInput bad = in;
  bad.fragment_elements = {};
  refused(bad, "no parameters");
  bad = in;
  bad.fragment_elements = {50, 50};
  refused(bad, "1 fragment");
  bad.method = PlanMethod::kStreaming;
  bad.tau = 100;
  refused(bad, "tau");
  bad = in;
  bad.step_time_s = -1;
  refused(bad, "step time");
  bad = in;
  bad.link.connections = 0;
  refused(bad, "connections");
  EXPECT_TRUE(absl::IsInvalidArgument(RequiredBandwidth(in, 1.5).status()));

  EXPECT_DOUBLE_EQ(*ParseBandwidth("1gbit"), 1e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("20Mbit/s"), 20e6);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("2.5e9"), 2.5e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("100mbps"), 100e6);
  EXPECT_DOUBLE_EQ(*ParseDuration("50ms"), 0.05);
  EXPECT_DOUBLE_EQ(*ParseDuration("0"), 0);
  EXPECT_FALSE(ParseBandwidth("fast").ok());
  EXPECT_FALSE(ParseBandwidth("0mbit").ok());
  EXPECT_NE(ParseBandwidth("10 furlongs").status().message().find("unknown unit"),
            std::string::npos);
  EXPECT_FALSE(ParseDuration("-5ms").ok());
}

TEST(AutoTuneTest, ChoosesTheSmallestTauThatReachesTheTarget) {
  TauChoice c = ChooseTau(FourFragments(), 0.95);
  EXPECT_EQ(c.tau, 10);  // tau = 9 predicts 4 / 4.4 = 90.9%
  EXPECT_NEAR(c.predicted, 1.0, 1e-9);
  EXPECT_NEAR(c.predicted_tau0, 0.5, 1e-9);
  c = ChooseTau(FourFragments(), 0.9);
  EXPECT_EQ(c.tau, 9);
  // Unreachable (a fragment due every 10 steps needs 30 of link): the best tau, not the largest.
  PlanInput slow = FourFragments();
  slow.link.bandwidth_bps = 16e6 / 3;
  c = ChooseTau(slow, 0.95);
  EXPECT_LT(c.predicted, 0.95);
  for (int tau = 0; tau < 40; ++tau) {
    slow.tau = tau;
    EXPECT_LE(Simulate(slow).utilization, c.predicted + 1e-9) << tau;
  }
}

TEST(AutoTuneTest, FollowsTheSlowestIslandAndLinkAndIgnoresNoise) {
  PlanInput run = FourFragments();
  TauTuner tuner(run, 0.95);
  EXPECT_FALSE(tuner.tau().has_value());
  EXPECT_FALSE(tuner.Report("a", {10, 0}).has_value());  // no link measured yet
  auto c = tuner.Report("a", {10, 16e6});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->tau, 10);
  EXPECT_FALSE(tuner.Report("a", {10.5, 15e6}).has_value());  // within a quarter: no change
  c = tuner.Report("b", {10, 8e6});  // a slower link: round trips of 20 steps
  ASSERT_TRUE(c.has_value());
  PlanInput slower = run;
  slower.link.bandwidth_bps = 8e6;
  EXPECT_EQ(c->tau, ChooseTau(slower, 0.95).tau);
  EXPECT_GE(c->tau, 19);
  EXPECT_DOUBLE_EQ(c->link_bps, 8e6);
  tuner.Forget("b");
  c = tuner.Report("a", {10, 16e6});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*tuner.tau(), 10);

  // With headroom 2 the tuner plans the 16 Mbit/s link as 8 Mbit/s.
  TauTuner cautious(run, 0.95, 2);
  c = cautious.Report("a", {10, 16e6});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->tau, ChooseTau(slower, 0.95).tau);
  EXPECT_DOUBLE_EQ(c->link_bps, 8e6);

  EXPECT_TRUE(ValidateFigures({10, 1e9}).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateFigures({NAN, 1e9})));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateFigures({10, -1})));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateFigures({10, INFINITY})));
}

}  // namespace
}  // namespace atl::outer
