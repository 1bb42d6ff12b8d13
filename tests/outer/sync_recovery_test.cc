// The sync service when islands fall behind, go silent, join late or lose transfers, and in
// async mode.
#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

TEST_F(SyncServerTest, AStaleIslandResyncsAndGoesOn) {
  options_.min_islands = 1;
  options_.round_timeout_s = 0.01;
  auto s = Make();
  InProcessTransport t(s.get());
  Join(*s, "a");
  Join(*s, "b");
  IslandSync b(&t, "run", Id("b"), 4);
  ASSERT_TRUE(b.FetchGlobal().ok());
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1})).ok());
  s->Tick(absl::Now() + absl::Seconds(1));  // round 0 commits without b
  const std::vector<float> made_from = b.global();
  auto r = b.SyncRound({0, 0, 0, 0}, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resynced);
  EXPECT_THAT(r->resync_reason, HasSubstr("already committed"));
  // What b's refused push was made from, for b to carry its steps onto the new global copy.
  EXPECT_EQ(r->refused_from, made_from);
  EXPECT_EQ(b.global(), s->params());
  EXPECT_EQ(b.round(), 1u);
}

// The transport of an island whose push reached a service process that died before the round was
// durable: the push is answered, and goes nowhere. Every other call goes to `to`, which a test
// points at the restarted service.
class LostPushTransport : public Transport {
 public:
  explicit LostPushTransport(Transport* to) : to(to) {}
  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& r) override { return to->Join(r); }
  absl::Status Leave(const pb::LeaveRequest& r) override { return to->Leave(r); }
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& r) override {
    return to->Heartbeat(r);
  }
  absl::StatusOr<pb::PushResponse> Push(const PushSource& source, int lane) override {
    if (!lose_next) return to->Push(source, lane);
    lose_next = false;
    pb::PushRequest m;
    for (auto more = source(&m); more.ok() && *more; more = source(&m)) {
    }
    return pb::PushResponse();
  }
  absl::Status AwaitUpdate(const pb::UpdateRequest& r, const ChunkSink<pb::UpdateChunk>& sink,
                           int lane) override {
    return to->AwaitUpdate(r, sink, lane);
  }
  absl::Status FetchState(const pb::FetchStateRequest& r, const ChunkSink<pb::StateChunk>& sink,
                          int lane) override {
    return to->FetchState(r, sink, lane);
  }
  Transport* to;
  bool lose_next = false;
};

// A service that restarts from its durable state has lost the pushes to the round it reopens. An
// island whose push it lost, awaiting that round's update, is told so (ABORTED) instead of waiting
// for a round that waits for it; it pushes the same contribution again (FP4 with error feedback:
// made from the residual it was made from the first time), and the run goes on bit-identical to
// one where nothing was lost.
TEST_F(SyncServerTest, APushLostToARestartIsPushedAgainAndTheRunIsUnchanged) {
  const std::vector<float> init = TwoIslandsOf1000();
  options_.codec = *compression::ParseCodec("fp4_e2m1");
  // Two rounds, a restart from the state after the first, two more; a's push to the first round
  // after the restart lost when `lose`. The parameters after the last round.
  auto run = [&](bool lose) -> std::vector<float> {
    auto s = Make(init);
    Join(*s, "a");
    Join(*s, "b");
    InProcessTransport ta(s.get()), tb(s.get());
    LostPushTransport to_a(&ta), to_b(&tb);
    IslandSyncOptions so;
    so.codec = options_.codec;
    so.error_feedback = true;
    const auto id_a = std::make_shared<IslandIdentity>("a", sessions_["a"]);
    const auto id_b = std::make_shared<IslandIdentity>("b", sessions_["b"]);
    IslandSync a(&to_a, "run", id_a, 1000, so), b(&to_b, "run", id_b, 1000, so);
    EXPECT_TRUE(a.FetchGlobal().ok() && b.FetchGlobal().ok());
    for (int round = 0; round < 2; ++round) {
      auto [ra, rb] = SyncBoth(a, b, round);
      EXPECT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
    }
    auto restarted = Resumed(*s, init);
    Join(*restarted, "a");
    Join(*restarted, "b");
    id_a->set_session(sessions_["a"]);
    id_b->set_session(sessions_["b"]);
    InProcessTransport ta2(restarted.get()), tb2(restarted.get());
    to_a.to = &ta2;
    to_b.to = &tb2;
    if (lose) {
      // Before a push of a's reaches the reopened round, waiting for its update is refused.
      pb::UpdateRequest u;
      u.set_run_id("run");
      u.set_island_id("a");
      u.set_session(sessions_["a"]);
      u.set_round(2);
      auto waited = restarted->AwaitUpdate(u, absl::Now() + absl::Seconds(10));
      EXPECT_EQ(waited.status().code(), absl::StatusCode::kAborted) << waited.status();
      EXPECT_THAT(std::string(waited.status().message()),
                  HasSubstr("resumed from its durable state since; push it again"));
    }
    to_a.lose_next = lose;
    for (int round = 2; round < 4; ++round) {
      auto [ra, rb] = SyncBoth(a, b, round);
      EXPECT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
      EXPECT_FALSE(ra->resynced);
      EXPECT_EQ(a.global(), restarted->params());
    }
    EXPECT_FALSE(to_a.lose_next);
    EXPECT_EQ(restarted->round(), 4u);
    return restarted->params();
  };
  EXPECT_EQ(run(true), run(false));
}

// The token ledger is part of the durable state: a coordinator restarted from it goes on counting
// where it stopped (before, the first slice after a restart counted every token again, and a chaos
// run's report showed 1.5x the tokens trained), and each island's account balances:
// trained = on time + stale + recomputed + refused + lost.
TEST_F(SyncServerTest, TheLedgerSurvivesARestartAndBalances) {
  const std::vector<float> init = TwoIslandsOf1000();
  std::vector<CommittedRound> rounds;  // of both services
  auto beat = [&](SyncServer& s, const std::string& island, uint64_t trained) {
    pb::HeartbeatRequest h;
    h.set_run_id("run");
    h.set_island_id(island);
    h.set_session(sessions_[island]);
    h.mutable_telemetry()->set_process(island == "a" ? 11 : 22);
    h.mutable_telemetry()->set_tokens_trained(trained);
    ASSERT_TRUE(s.Heartbeat(h).ok());
  };
  auto s = Make(init);
  s->SetCommitListener([&](const CommittedRound& r) { rounds.push_back(r); });
  Join(*s, "a");
  Join(*s, "b");
  InProcessTransport ta(s.get()), tb(s.get());
  const auto id_a = std::make_shared<IslandIdentity>("a", sessions_["a"]);
  const auto id_b = std::make_shared<IslandIdentity>("b", sessions_["b"]);
  IslandSync a(&ta, "run", id_a, 1000), b(&tb, "run", id_b, 1000);
  ASSERT_TRUE(a.FetchGlobal().ok() && b.FetchGlobal().ok());
  for (int round = 0; round < 2; ++round) {
    beat(*s, "a", 100 * (round + 1));
    beat(*s, "b", 50 * (round + 1) + 30);  // b has trained 30 tokens it never pushes
    auto [ra, rb] = SyncBoth(a, b, round);
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  }
  pb::ServiceState state;
  auto restarted = Resumed(*s, init, &state);
  ASSERT_EQ(state.ledger_size(), 2);
  restarted->SetCommitListener([&](const CommittedRound& r) { rounds.push_back(r); });
  Join(*restarted, "a");
  Join(*restarted, "b");
  id_a->set_session(sessions_["a"]);
  id_b->set_session(sessions_["b"]);
  InProcessTransport ta2(restarted.get()), tb2(restarted.get());
  IslandSync a2(&ta2, "run", id_a, 1000), b2(&tb2, "run", id_b, 1000);
  ASSERT_TRUE(a2.FetchGlobal().ok() && b2.FetchGlobal().ok());
  for (int round = 2; round < 4; ++round) {
    beat(*restarted, "a", 100 * (round + 1));  // the same processes: their totals go on
    beat(*restarted, "b", 50 * (round + 1) + 30);
    auto [ra, rb] = SyncBoth(a2, b2, round);
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  }
  ASSERT_EQ(rounds.size(), 4u);
  std::map<std::string, TokenAccount> summed;  // what a report adds up from rounds.jsonl
  for (const auto& r : rounds) {
    for (const auto& [island, slice] : r.ledger) summed[island].Add(slice);
  }
  for (const auto& i : restarted->GetStatus().islands) {
    const TokenAccount& t = i.tokens;
    SCOPED_TRACE(i.island_id);
    EXPECT_EQ(t.trained, i.island_id == "a" ? 400u : 230u);
    EXPECT_EQ(t.on_time, i.island_id == "a" ? 400u : 200u);
    EXPECT_EQ(t.lost(), i.island_id == "a" ? 0u : 30u);
    EXPECT_EQ(t.trained, t.on_time + t.stale + t.recomputed + t.refused_total() + t.lost());
    EXPECT_EQ(summed[i.island_id].trained, t.trained);
    EXPECT_EQ(summed[i.island_id].on_time, t.on_time);
  }
}

// ---- Elastic membership.

TEST_F(SyncServerTest, ASilentIslandIsDroppedWhenItsLeaseExpiresAndTheRoundCommits) {
  options_.num_data_streams = 2;
  options_.lease_s = 1;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1})).ok());
  s->Tick(absl::Now());
  EXPECT_EQ(s->round(), 0u);  // b is silent but its lease holds
  std::vector<std::string> events;
  s->SetEventListener([&](const std::string& e) { events.push_back(e); });
  absl::SleepFor(absl::Milliseconds(600));
  pb::HeartbeatRequest beat;
  beat.set_run_id("run");
  beat.set_island_id("a");
  beat.set_session(sessions_["a"]);
  ASSERT_TRUE(s->Heartbeat(beat).ok());
  // 0.5 s later a has been silent for 0.5 s, b for 1.1 s: only b's lease has run out.
  s->Tick(absl::Now() + absl::Milliseconds(500));
  EXPECT_EQ(s->round(), 1u);
  EXPECT_EQ(s->params(), (std::vector<float>{0, 1, 2, 3}));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0], HasSubstr("island 'b' declared dead"));
  // b comes back: told to rejoin; the state is untouched by its stale push.
  auto r = s->Push(Payload("b", 1, {1, 1, 1, 1}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("rejoin"));
  EXPECT_EQ(s->round(), 1u);
  beat.set_island_id("b");
  beat.set_session(sessions_["b"]);
  EXPECT_EQ(s->Heartbeat(beat).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SyncServerTest, ALateJoinerIsNotWaitedForInTheOpenRound) {
  options_.num_data_streams = 3;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  Join(*s, "c");
  for (const char* i : {"a", "b", "c"}) ASSERT_TRUE(s->Push(Payload(i, 0, {1, 1, 1, 1})).ok());
  ASSERT_EQ(s->round(), 1u);
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("c");
  leave.set_session(sessions_["c"]);
  ASSERT_TRUE(s->Leave(leave).ok());
  Join(*s, "d");  // joins while round 1 is open: waited for from round 2
  ASSERT_TRUE(s->Push(Payload("a", 1, {1, 1, 1, 1})).ok());
  ASSERT_TRUE(s->Push(Payload("b", 1, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->round(), 2u);  // committed without d
  ASSERT_TRUE(s->Push(Payload("a", 2, {1, 1, 1, 1})).ok());
  ASSERT_TRUE(s->Push(Payload("b", 2, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->round(), 2u);  // round 2 waits for d
  ASSERT_TRUE(s->Push(Payload("d", 2, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->round(), 3u);
  const auto state = s->GetState();
  ASSERT_EQ(state.islands_size(), 3);
  EXPECT_EQ(state.islands(2).state(), "active");
}

// ---- Faults on the wire.

TEST_F(SyncServerTest, IslandsSurviveDroppedCorruptedAndCutTransfers) {
  options_.optimizer = {0.7, 0.9, true};
  options_.num_data_streams = 2;
  options_.codec = *compression::ParseCodec("fp4_e2m1");
  options_.chunk_bytes = 256;
  layout_.numels = {4000};
  auto s = Make(Sines(4000));
  InProcessTransport t1(s.get()), t2(s.get());
  Faults faults;
  faults.drop = 0.1;
  faults.corrupt = 0.01;  // per chunk of 256 bytes
  faults.cut_after_bytes = 10000;  // the first state transfer is cut part way through
  faults.seed = 3;
  FaultyTransport f1(&t1, faults);
  faults.seed = 4;
  FaultyTransport f2(&t2, faults);
  Join(*s, "a");
  Join(*s, "b");
  IslandSyncOptions so;
  so.codec = options_.codec;
  so.chunk_bytes = 256;
  so.fetch_piece_bytes = 4096;  // 4 pieces
  so.retries = 8;
  IslandSync a(&f1, "run", Id("a"), 4000, so), b(&f2, "run", Id("b"), 4000, so);
  const auto fa = a.FetchGlobal(), fb = b.FetchGlobal();
  ASSERT_TRUE(fa.ok()) << fa;
  ASSERT_TRUE(fb.ok()) << fb;
  EXPECT_EQ(a.global(), s->params());
  int resyncs = 0;
  for (int round = 0; round < 10; ++round) {
    auto [ra, rb] = SyncBoth(a, b, round);
    ASSERT_TRUE(ra.ok()) << ra.status();
    ASSERT_TRUE(rb.ok()) << rb.status();
    resyncs += ra->resynced + rb->resynced;
    // Whatever happened on the wire, both copies equal the service's, bit for bit.
    EXPECT_EQ(a.global(), s->params()) << "round " << round;
    EXPECT_EQ(b.global(), s->params()) << "round " << round;
  }
  EXPECT_EQ(s->round(), 10u);  // no round lost, none applied twice
  EXPECT_GT(f1.dropped() + f2.dropped(), 0u);
  EXPECT_GT(f1.corrupted() + f2.corrupted(), 0u);
  EXPECT_EQ(f1.cut() + f2.cut(), 2u);
  // A corrupted update is never applied: the island re-fetches the state instead.
  EXPECT_GT(resyncs, 0);
}

// ---- Async mode.

TEST(DynamicLocalStepsTest, HFollowsTheThroughputRatio) {
  EXPECT_EQ(DynamicLocalSteps(3.0, 3.0, 50), 50u);    // the fastest island keeps H
  EXPECT_EQ(DynamicLocalSteps(1.0, 3.0, 50), 16u);    // floor(50 / 3)
  EXPECT_EQ(DynamicLocalSteps(2.0, 3.0, 50), 33u);    // floor(33.3)
  EXPECT_EQ(DynamicLocalSteps(0.01, 3.0, 50), 1u);    // at least one step
  EXPECT_EQ(DynamicLocalSteps(0.0, 3.0, 50), 50u);    // no measurement yet: H
  EXPECT_EQ(DynamicLocalSteps(4.0, 3.0, 50), 50u);    // never above H
}

TEST_F(SyncServerTest, AsyncAppliesEachContributionAtOnceAndRefusesStaleOnes) {
  options_.async = true;
  options_.max_staleness = 2;
  options_.num_data_streams = 2;
  options_.optimizer = {1.0, 0.0, false};
  options_.sync_every = 30;
  options_.token_budget = 25;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  auto pa = Payload("a", 0, {1, 1, 1, 1}, 10);
  pa[0].set_inner_steps_per_s(3.0);
  auto r = s->Push(pa);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 1u);  // applied at once: no round to wait for
  EXPECT_EQ(r->staleness(), 0u);
  EXPECT_EQ(s->params(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(r->sync_every(), 30u);
  // b started from version 0 and arrives one version late, three times slower.
  auto pb = Payload("b", 0, {1, 1, 1, 1}, 10);
  pb[0].set_inner_steps_per_s(1.0);
  r = s->Push(pb);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version(), 2u);
  EXPECT_EQ(r->staleness(), 1u);
  EXPECT_EQ(r->sync_every(), 10u);  // DyLU: floor(1 / 3 * 30)
  EXPECT_EQ(r->tokens_committed(), 20u);
  EXPECT_FALSE(r->budget_reached());
  // The same base again is a duplicate; a version from the future is unknown.
  EXPECT_EQ(s->Push(Payload("b", 0, {1, 1, 1, 1})).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->Push(Payload("a", 7, {1, 1, 1, 1})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s->Push(Payload("a", 2, {1, 1, 1, 1}, 10)).ok());  // version 3, budget reached
  EXPECT_TRUE(s->budget_reached());
  // GetState tells the same schedule as Join.
  EXPECT_TRUE(s->GetState().schedule().async());
  EXPECT_EQ(s->GetState().schedule().token_budget(), 25u);
  const auto before = s->params();
  // b's base 0 again would be 3 versions stale: refused (before the duplicate check), untouched.
  r = s->Push(Payload("b", 0, {1, 1, 1, 1}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("3 versions stale (the bound is 2)"));
  EXPECT_EQ(s->params(), before);
  EXPECT_EQ(s->round(), 3u);
}

// An async warm start: a push of one of the island's first warm_start_steps steps is its share of
// a plain average (g / N, unscaled for staleness, the momentum and its period untouched); the
// pushes after it take the delayed Nesterov step with staleness scaling.
TEST_F(SyncServerTest, AsyncWarmStartPushesAreSharesOfAPlainAverage) {
  options_.async = true;
  options_.staleness_scaling = true;
  options_.num_data_streams = 2;
  options_.optimizer = {1.0, 0.5, true, 2};  // delayed Nesterov, N = 2
  options_.phases.warm_start_steps = 2;
  auto s = Make();  // {1, 2, 3, 4}
  Join(*s, "a");
  Join(*s, "b");
  auto push = [&](const std::string& island, uint64_t base, uint64_t step, float g) {
    auto p = Payload(island, base, {g, g, g, g});
    p[0].set_step(step);
    return s->Push(p);
  };
  auto shifted = [](float by) { return std::vector<float>{1 - by, 2 - by, 3 - by, 4 - by}; };
  ASSERT_TRUE(push("a", 0, 1, 1).ok());
  EXPECT_EQ(s->params(), shifted(0.5f));  // g / 2
  auto r = push("b", 0, 1, 4);            // one version stale, not scaled: 4 / 2
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->staleness(), 1u);
  EXPECT_EQ(s->params(), shifted(2.5f));
  ASSERT_TRUE(push("a", 1, 2, 1).ok());
  EXPECT_EQ(s->params(), shifted(3.0f));
  // Past the warm start: the first of the period is lr g / N (three warm pushes counted in the
  // period would make it a momentum step: 0.75).
  ASSERT_TRUE(push("a", 3, 4, 1).ok());
  EXPECT_EQ(s->params(), shifted(3.5f));
  // Two versions stale: g = 3 / 3 = 1; the momentum step: m = (1 + 1) / 2, u = 1 / 2 + 0.5 m.
  r = push("b", 2, 3, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->staleness(), 2u);
  EXPECT_EQ(s->params(), shifted(4.5f));
  // An island does not go back into its warm start by claiming an earlier step: a's push "at step
  // 2" after its step 4 is one version stale and scaled (1 / 2 x 1 / 2), not a warm share (1 / 2).
  ASSERT_TRUE(push("a", 4, 2, 1).ok());
  EXPECT_EQ(s->params(), shifted(4.75f));
}

// An async run's outer lr follows the schedule at the round of H steps its tokens have reached:
// a budget of 40 tokens, 8 inner steps per island at H = 2 (4 rounds), a warmup of 1 round, then
// cosine to 0 over rounds 1-3.
TEST_F(SyncServerTest, AsyncOuterLrFollowsTheRunsProgress) {
  options_.async = true;
  options_.num_data_streams = 2;
  options_.sync_every = 2;
  options_.total_inner_steps = 8;
  options_.token_budget = 40;
  options_.optimizer = {1.0, 0.0, false};
  options_.optimizer.warmup_rounds = 1;
  options_.optimizer.decay = LrDecay::kCosine;
  options_.optimizer.min_lr_ratio = 0.0;
  auto s = Make(std::vector<float>(4, 0.0f));
  Join(*s, "a");
  Join(*s, "b");
  const std::vector<std::pair<float, float>> lr_then_params = {
      {0.5f, -0.5f},   // 0 of 40 tokens, round 0: the warmup's lr x 1 / 2
      {1.0f, -1.5f},   // 10: round 1, the cosine's start
      {0.5f, -2.0f},   // 20: round 2, its middle
      {0.0f, -2.0f}};  // 30: round 3, its end
  for (uint64_t v = 0; v < lr_then_params.size(); ++v) {
    ASSERT_TRUE(s->Push(Payload(v % 2 == 0 ? "a" : "b", v, {1, 1, 1, 1}, 10)).ok());
    EXPECT_EQ(s->params(), std::vector<float>(4, lr_then_params[v].second))
        << "version " << v + 1 << ", lr " << lr_then_params[v].first;
  }
}

TEST_F(SyncServerTest, AsyncIslandsCatchUpAndStayBitIdentical) {
  options_.async = true;
  options_.num_data_streams = 2;
  options_.optimizer = {0.7, 0.9, true, 2};  // delayed Nesterov, N = 2
  options_.codec = *compression::ParseCodec("fp4_e2m1");
  layout_.numels = {1000};
  const std::vector<float> init = Sines(1000);
  auto s = Make(init);
  InProcessTransport t1(s.get()), t2(s.get());
  Join(*s, "a");
  Join(*s, "b");
  IslandSyncOptions so;
  so.codec = options_.codec;
  so.async = true;
  so.chunk_bytes = 256;
  IslandSync a(&t1, "run", Id("a"), 1000, so), b(&t2, "run", Id("b"), 1000, so);
  ASSERT_TRUE(a.FetchGlobal().ok());
  ASSERT_TRUE(b.FetchGlobal().ok());
  // a pushes three times for each push of b: b catches up over several versions each time.
  for (int k = 0; k < 12; ++k) {
    IslandSync& island = k % 4 == 3 ? b : a;
    std::vector<float> local = island.global();
    for (size_t i = 0; i < 1000; ++i) local[i] -= 0.01f * std::cos(float(i * (k + 1)));
    auto r = island.SyncRound(local, 100);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->resynced) << r->resync_reason;
    EXPECT_EQ(r->version, s->round());
    EXPECT_EQ(island.global(), s->params());
    EXPECT_EQ(island.global_hash(), s->params_hash());
    if (&island == &b) {
      EXPECT_EQ(r->staleness, 3u);
    }
  }
  // The other island catches up at the end without pushing.
  auto caught = a.CatchUp(s->round());
  ASSERT_TRUE(caught.ok()) << caught.status();
  EXPECT_EQ(a.global_hash(), s->params_hash());
  EXPECT_EQ(a.round(), 12u);
}

TEST_F(SyncServerTest, AsyncIslandTooFarBehindFetchesTheFullState) {
  options_.async = true;
  options_.max_staleness = 1;
  options_.num_data_streams = 2;
  auto s = Make();
  InProcessTransport t(s.get());
  Join(*s, "a");
  Join(*s, "b");
  IslandSyncOptions so;
  so.async = true;
  IslandSync b(&t, "run", Id("b"), 4, so);
  ASSERT_TRUE(b.FetchGlobal().ok());
  for (uint64_t v = 0; v < 3; ++v) ASSERT_TRUE(s->Push(Payload("a", v, {1, 1, 1, 1})).ok());
  auto r = b.SyncRound({0, 0, 0, 0}, 10);  // 3 versions stale, bound 1
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resynced);
  EXPECT_THAT(r->resync_reason, HasSubstr("versions stale"));
  EXPECT_EQ(b.global(), s->params());
  EXPECT_EQ(r->version, 3u);
}

}  // namespace
}  // namespace atl::outer
