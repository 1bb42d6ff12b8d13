// The sync service with every codec: bit-identical copies, striped connections, the outer lr
// schedule, error feedback and sparse contributions, refusals of another codec.
#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

TEST_F(SyncServerTest, IslandsStayBitIdenticalWithTheServiceWithEveryCodec) {
  options_.optimizer = {0.7, 0.9, true};
  options_.num_data_streams = 2;
  layout_.numels = {1000};
  const std::vector<float> init = Sines(1000);
  std::vector<compression::CodecSpec> specs;
  for (const char* name :
       {"fp32", "bf16", "int8", "fp4_e2m1", "fp4_e3m0", "int2", "int2_centroid"}) {
    specs.push_back(*compression::ParseCodec(name));
  }
  // Sparse: top-4 of 64 in int2 and int2_centroid, top-8 of 128 in fp4 (Nesterov makes the
  // updates after the first dense: they come back in dense FP4).
  specs.push_back(*compression::MakeSpec(int(compression::Codec::kInt2), 64, 4));
  specs.push_back(*compression::MakeSpec(int(compression::Codec::kInt2Centroid), 64, 4));
  specs.push_back(*compression::MakeSpec(int(compression::Codec::kFp4E2M1), 128, 8));
  for (const compression::CodecSpec& spec : specs) {
    SCOPED_TRACE(compression::SpecText(spec));
    options_.codec = spec;
    auto s = Make(init);
    InProcessTransport t1(s.get()), t2(s.get());
    Join(*s, "a");
    Join(*s, "b");
    IslandSyncOptions so;
    so.codec = options_.codec;
    so.chunk_bytes = 256;
    so.error_feedback = true;
    IslandSync a(&t1, "run", Id("a"), 1000, so), b(&t2, "run", Id("b"), 1000, so);
    ASSERT_TRUE(a.FetchGlobal().ok());
    ASSERT_TRUE(b.FetchGlobal().ok());
    uint64_t sent = 0;
    for (int round = 0; round < 5; ++round) {
      auto [ra, rb] = SyncBoth(a, b, round);
      ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
      EXPECT_FALSE(ra->resynced);
      EXPECT_EQ(a.global(), s->params());
      EXPECT_EQ(b.global(), s->params());
      EXPECT_EQ(a.global_hash(), s->params_hash());
      sent += ra->bytes_sent;
    }
    EXPECT_EQ(a.round(), 5u);
    // Payload bytes follow the codec, plus at most 64 header bytes per chunk of <= 256 bytes.
    const double encoded = double(compression::EncodedBytes(options_.codec, 1000));
    EXPECT_GE(double(sent) / 5, encoded);
    EXPECT_LT(double(sent) / 5, encoded + 64 * (encoded / 128 + 1));
  }
}

// Several connections: every payload is cut into parts sent at once (whole chunks of a whole
// fragment, whole ranges of a rank's), and nothing else changes: the same bytes, the same global
// parameters bit for bit, the same residuals; also when calls are dropped and chunks corrupted on
// the way (a retried part is encoded again and must come out the same).
TEST_F(SyncServerTest, ConnectionsStripePayloadsAndChangeNoBit) {
  const std::vector<float> init = TwoIslandsOf1000();
  struct Trace {
    std::vector<std::vector<float>> params, residuals;
    uint64_t sent = 0, received = 0;
  };
  for (const char* name : {"fp32", "fp4_e2m1"}) {
    options_.codec = *compression::ParseCodec(name);
    auto run = [&](int connections, double faults, bool error_feedback) {
      SCOPED_TRACE(absl::StrCat(name, ", ", connections, " connections, faults ", faults));
      Trace trace;
      auto s = Make(init);
      InProcessTransport t0(s.get(), absl::Seconds(60), connections);
      IslandSyncOptions so;
      so.codec = options_.codec;
      so.chunk_bytes = 128;
      so.stochastic_rounding = true;
      so.seed = 7;
      so.error_feedback = error_feedback;
      so.fetch_piece_bytes = 1024;      // a state transfer of 4 pieces
      ThreeRanks t = JoinThreeRanks(*s, &t0, faults, so);
      for (int round = 0; round < 4; ++round) {
        auto ra = SyncThree(t, round);
        EXPECT_TRUE(ra.ok()) << ra.status();
        if (!ra.ok()) return trace;
        EXPECT_EQ(t.a->global(), s->params());
        trace.params.push_back(s->params());
        trace.residuals.push_back(t.a->residual());
        trace.sent += ra->bytes_sent;
        trace.received += ra->bytes_received;
      }
      if (faults > 0) {
        EXPECT_GT(t.dropped(), 0u);
        EXPECT_GT(t.corrupted(), 0u);
      }
      return trace;
    };
    const Trace one = run(1, 0, true), three = run(3, 0, true);
    EXPECT_EQ(three.params, one.params);
    EXPECT_EQ(three.residuals, one.residuals);
    // The same chunks, cut into parts; each part's first message carries the session and figures.
    EXPECT_GE(three.sent, one.sent);
    EXPECT_LE(three.sent, one.sent + 4 * 2 * 64);
    EXPECT_GT(three.received, 0u);
    // Faults: a corrupted update makes its island fetch the state, which resets an error-feedback
    // residual (by design), so this comparison runs without error feedback.
    const Trace clean = run(1, 0, false), faulty = run(3, 0.1, false);
    EXPECT_EQ(faulty.params, clean.params);
  }
}

// The service steps each round with its scheduled outer lr: with plain SGD, warmup over one round
// and a cosine to 0 over 3 rounds, the same pseudo-gradient moves the parameters by 0.5, 1, 0.
TEST_F(SyncServerTest, EachRoundStepsWithItsScheduledOuterLr) {
  options_.num_data_streams = 1;
  options_.optimizer = {1.0, 0.0, false};
  options_.optimizer.warmup_rounds = 1;
  options_.optimizer.decay = LrDecay::kCosine;
  options_.sync_every = 10;
  options_.total_inner_steps = 40;  // 4 rounds: warmup, then cosine over rounds 1..3
  auto s = Make({0, 0, 0, 0});
  Join(*s, "a");
  const std::vector<float> moved[] = {{-0.5f, -0.5f, -0.5f, -0.5f}, {-1.5f, -1.5f, -1.5f, -1.5f},
                                      {-2.0f, -2.0f, -2.0f, -2.0f}, {-2.0f, -2.0f, -2.0f, -2.0f}};
  for (uint64_t round = 0; round < 4; ++round) {
    ASSERT_TRUE(s->Push(Payload("a", round, {1, 1, 1, 1})).ok());
    EXPECT_EQ(s->params(), moved[round]) << "round " << round;
  }
}

TEST_F(SyncServerTest, ErrorFeedbackCarriesWhatTheCodecDropped) {
  options_.num_data_streams = 1;
  options_.optimizer = {1.0, 0.0, false};
  options_.codec = *compression::ParseCodec("fp4_e2m1");
  layout_.numels = {64};
  auto s = Make(std::vector<float>(64, 0.0f));
  InProcessTransport t(s.get());
  Join(*s, "a");
  IslandSyncOptions so;
  so.codec = options_.codec;
  so.error_feedback = true;
  IslandSync a(&t, "run", Id("a"), 64, so);
  ASSERT_TRUE(a.FetchGlobal().ok());
  // A constant pseudo-gradient that FP4 cannot represent next to a larger value in its block.
  std::vector<float> delta(64, 0.1f);
  delta[0] = 6.0f;
  for (int round = 0; round < 8; ++round) {
    std::vector<float> local = a.global();
    for (size_t i = 0; i < 64; ++i) local[i] -= delta[i];
    ASSERT_TRUE(a.SyncRound(local, 1).ok());
  }
  const double moved = -double(a.global()[5]);
  // Without feedback 0.1 rounds to 0 (scale 1: 0.1 < 0.25) and the element never moves; with it
  // the residual accumulates until it is sent: 8 rounds move it by about 8 x 0.1.
  EXPECT_NEAR(moved, 0.8, 0.26);
  EXPECT_LT(std::fabs(a.residual()[5]), 0.26f);
}

// Pushes pass through as they are; each chunk is kept (what the service was sent).
class RecordingTransport : public InProcessTransport {
 public:
  using InProcessTransport::InProcessTransport;
  absl::StatusOr<pb::PushResponse> Push(const PushSource& source, int lane) override {
    return InProcessTransport::Push(
        [&](pb::PushRequest* m) {
          auto more = source(m);
          if (more.ok() && *more) pushed.push_back(m->chunk());
          return more;
        },
        lane);
  }
  std::vector<pb::Chunk> pushed;
};

// SparseLoCo's accumulator: e <- beta e + delta; D = Q(TopK(e)); e <- e - D. With beta = 1 what
// was sent plus the residual is the sum of the pseudo-gradients; with beta < 1 the recurrence
// holds exactly, element by element, with D what the service received.
TEST_F(SyncServerTest, ErrorFeedbackCarriesExactlyWhatWasNotSent) {
  options_.num_data_streams = 1;
  options_.optimizer = {1.0, 0.0, false};
  layout_.numels = {600};
  for (const float beta : {1.0f, 0.9f}) {
    for (const char* values : {"fp32", "int2"}) {
      SCOPED_TRACE(absl::StrCat(values, " beta ", beta));
      options_.codec = *compression::MakeSpec(int(compression::ParseCodec(values)->codec), 128, 5);
      auto s = Make(Sines(600));
      RecordingTransport t(s.get());
      Join(*s, "a");
      IslandSyncOptions so;
      so.codec = options_.codec;
      so.error_feedback = true;
      so.error_feedback_decay = beta;
      IslandSync a(&t, "run", Id("a"), 600, so);
      ASSERT_TRUE(a.FetchGlobal().ok());
      std::vector<double> pseudo_sum(600, 0.0), sent_sum(600, 0.0);
      std::vector<float> e(600, 0.0f);
      for (int round = 0; round < 6; ++round) {
        std::vector<float> local = a.global(), delta(600);
        for (size_t i = 0; i < 600; ++i) {
          local[i] -= 0.01f * std::sin(float(i * (round + 3)));
          delta[i] = a.global()[i] - local[i];  // the island's own subtraction
        }
        t.pushed.clear();
        ASSERT_TRUE(a.SyncRound(local, 1).ok());
        ASSERT_EQ(t.pushed.size(), 1u);
        std::vector<float> d(600);
        const auto& c = t.pushed[0];
        ASSERT_TRUE(compression::Decode(options_.codec,
                                        reinterpret_cast<const uint8_t*>(c.data().data()),
                                        c.data().size(), 600, d.data())
                        .ok());
        size_t kept = 0;
        for (size_t i = 0; i < 600; ++i) {
          const float accumulated = delta[i] + beta * e[i];
          e[i] = accumulated - d[i];
          ASSERT_EQ(a.residual()[i], e[i]) << "round " << round << " element " << i;
          pseudo_sum[i] += delta[i];
          sent_sum[i] += d[i];
          kept += d[i] != 0;
        }
        EXPECT_EQ(kept, 4 * 5 + 5u);  // 5 of each chunk of 128 (the last holds 88)
      }
      if (beta == 1.0f) {
        for (size_t i = 0; i < 600; ++i) {
          EXPECT_NEAR(sent_sum[i] + a.residual()[i], pseudo_sum[i], 1e-6) << i;
        }
      }
    }
  }
}

// An outer step that is not linear (Nesterov) cannot be relayed (tests/outer/relay_test.cc): its
// first update's support is the union of the contributions', and it comes back sparse (FP4
// values), far smaller than dense FP4; every copy stays the service's.
TEST_F(SyncServerTest, SparseContributionsComeBackAsTheirUnion) {
  options_.optimizer = {1.0, 0.9, true};
  options_.num_data_streams = 2;
  layout_.numels = {4096};
  options_.codec = *compression::MakeSpec(int(compression::Codec::kInt2), 1024, 10);
  auto s = Make(Sines(4096));
  InProcessTransport t1(s.get()), t2(s.get());
  Join(*s, "a");
  Join(*s, "b");
  IslandSyncOptions so;
  so.codec = options_.codec;
  so.error_feedback = true;
  IslandSync a(&t1, "run", Id("a"), 4096, so), b(&t2, "run", Id("b"), 4096, so);
  ASSERT_TRUE(a.FetchGlobal().ok());
  ASSERT_TRUE(b.FetchGlobal().ok());
  const std::vector<float> before = s->params();
  auto [ra, rb] = SyncBoth(a, b, 0);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  EXPECT_EQ(a.global(), s->params());
  EXPECT_EQ(b.global(), s->params());
  size_t moved = 0;
  for (size_t i = 0; i < 4096; ++i) moved += s->params()[i] != before[i];
  EXPECT_GT(moved, 40u);
  EXPECT_LE(moved, 80u);  // at most the union of 2 x 10 per chunk of 1024
  const size_t dense = compression::EncodedBytes(*compression::ParseCodec("fp4_e2m1"), 4096);
  EXPECT_LT(ra->bytes_received, dense / 4);
  EXPECT_LT(ra->bytes_sent, dense / 8);
}

TEST_F(SyncServerTest, AContributionInAnotherCodecIsRefused) {
  options_.num_data_streams = 2;
  options_.codec = *compression::ParseCodec("fp4_e2m1");
  auto s = Make();
  Join(*s, "a");
  auto r = s->Push(Payload("a", 0, {1, 1, 1, 1}));  // fp32
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("does not match the run's fp4_e2m1/32"));
}

}  // namespace
}  // namespace atl::outer
