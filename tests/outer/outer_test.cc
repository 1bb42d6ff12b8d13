// The outer-sync service and the island's side of it, through the in-process transport:
// membership, rounds, refusals and ranks. Codecs and error feedback: sync_codecs_test.cc; resyncs,
// leases, faults and async mode: sync_recovery_test.cc.
#include <atomic>
#include <condition_variable>

#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

// A commit runs outside the lock that membership takes: while one is held in progress, heartbeats,
// joins, state queries and other fragments' pushes are answered; a state fetch of the committing
// fragment waits for it and then sees the committed round.
TEST_F(SyncServerTest, MembershipNeverWaitsBehindACommit) {
  options_.num_data_streams = 2;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  s->SetCommitHookForTesting([&](uint32_t) {
    entered.set_value();
    released.wait();
  });
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1})).ok());
  auto last = std::async(std::launch::async, [&] { return s->Push(Payload("b", 0, {3, 3, 3, 3})); });
  entered.get_future().wait();
  auto answered = [](auto f) { return f.wait_for(std::chrono::seconds(10)) == std::future_status::ready; };
  pb::HeartbeatRequest hb;
  hb.set_run_id("run");
  hb.set_island_id("a");
  hb.set_session(sessions_["a"]);
  EXPECT_TRUE(answered(std::async(std::launch::async, [&] { return s->Heartbeat(hb).ok(); })));
  EXPECT_TRUE(answered(std::async(std::launch::async, [&] { return s->GetState().round(); })));
  pb::JoinRequest join;  // answered (every data stream is taken: refused)
  join.set_run_id("run");
  join.set_name("c");
  EXPECT_TRUE(answered(std::async(std::launch::async, [&] { return s->Join(join).ok(); })));
  EXPECT_EQ(s->round(), 0u);  // not published yet
  // A push again to the round being committed (the island's own) is refused at once.
  auto late = s->Push(Payload("a", 0, {1, 1, 1, 1}));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAlreadyExists) << late.status();
  const pb::FetchStateRequest fetch = Fetch("a");
  auto state = std::async(std::launch::async, [&] {
    InProcessTransport t(s.get());
    return atl::testing::FetchAll(t, fetch);
  });
  release.set_value();
  ASSERT_TRUE(last.get().ok());
  auto chunks = state.get();
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  EXPECT_EQ(chunks->front().chunk().header().round(), 1u);
  EXPECT_EQ(s->params(), (std::vector<float>{-1, 0, 1, 2}));
}

// State is streamed chunk by chunk from the live parameters: a round that commits while a range is
// being sent ends the stream with ABORTED, never with chunks of two rounds; a fetch in one piece
// sees one round whole, and a caller that goes away ends it with CANCELLED.
TEST_F(SyncServerTest, StateStreamsChunkByChunkAndAbortsWhenARoundCommitsMeanwhile) {
  auto s = ChunkedServiceOfTwo();
  const pb::FetchStateRequest fetch = Fetch("a");
  std::vector<uint64_t> rounds;
  auto whole = s->FetchState(fetch, [&](pb::StateChunk&& c) {
    rounds.push_back(c.chunk().header().round());
    return true;
  });
  ASSERT_TRUE(whole.ok()) << whole;
  EXPECT_EQ(rounds, std::vector<uint64_t>(16, 0));  // ceil(1000 / 64) chunks of round 0
  rounds.clear();
  auto cut = s->FetchState(fetch, [&](pb::StateChunk&& c) {
    rounds.push_back(c.chunk().header().round());
    if (rounds.size() == 1) {  // round 0 commits after the first chunk was sent
      EXPECT_TRUE(s->Push(Payload("a", 0, std::vector<float>(1000, 0.5f))).ok());
      EXPECT_TRUE(s->Push(Payload("b", 0, std::vector<float>(1000, 0.5f))).ok());
    }
    return true;
  });
  EXPECT_EQ(cut.code(), absl::StatusCode::kAborted) << cut;
  EXPECT_EQ(rounds, std::vector<uint64_t>{0});
  EXPECT_EQ(s->round(), 1u);
  auto gone = s->FetchState(fetch, [](pb::StateChunk&&) { return false; });
  EXPECT_EQ(gone.code(), absl::StatusCode::kCancelled) << gone;
}

// On a slow link an island's heartbeats wait behind a long state transfer or push: the data
// flowing renews its lease, so the island is not declared dead in the middle of it.
TEST_F(SyncServerTest, DataFlowingRenewsTheLease) {
  options_.lease_s = 0.2;
  auto s = ChunkedServiceOfTwo();
  const pb::FetchStateRequest fetch = Fetch("a");
  int chunks = 0;
  ASSERT_TRUE(s->FetchState(fetch, [&](pb::StateChunk&&) {
                 absl::SleepFor(absl::Milliseconds(30));  // 16 chunks: 0.48 s, over two leases
                 if (++chunks % 4 == 0) s->Tick(absl::Now());
                 return true;
               }).ok());
  s->Tick(absl::Now());
  const auto state = s->GetState();
  ASSERT_EQ(state.islands_size(), 1) << "b, silent all along, is gone: " << state.DebugString();
  EXPECT_EQ(state.islands(0).name(), "a");
}

TEST_F(SyncServerTest, RoundCommitsWhenAllMembersContributedWithTokenWeights) {
  options_.num_data_streams = 2;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1}, 30)).ok());
  EXPECT_EQ(s->round(), 0u);
  ASSERT_TRUE(s->Push(Payload("b", 0, {5, 5, 5, 5}, 10)).ok());
  EXPECT_EQ(s->round(), 1u);
  auto r = s->AwaitRound(0, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(r.ok());
  Assembler update({options_.run_id, "", 0, 0}, 4, 0, 4, options_.codec);
  for (const auto& c : (*r)->update_chunks) ASSERT_TRUE(update.Add(c).ok());
  EXPECT_EQ(update.values(), (std::vector<float>{2, 2, 2, 2}));  // (30*1 + 10*5) / 40
  EXPECT_EQ(s->params(), (std::vector<float>{-1, 0, 1, 2}));
  EXPECT_EQ((*r)->contributors, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*r)->params_hash, s->params_hash());
}

TEST_F(SyncServerTest, ResultDoesNotDependOnArrivalOrder) {
  options_.optimizer = {0.7, 0.9, true};
  options_.num_data_streams = 2;
  auto one = Make(), two = Make();
  const std::vector<float> da = {0.1f, 0.2f, 0.3f, 1e-7f}, db = {0.3f, -0.2f, 1e7f, 0.7f};
  Join(*one, "a");
  Join(*one, "b");
  ASSERT_TRUE(one->Push(Payload("a", 0, da, 7)).ok());
  ASSERT_TRUE(one->Push(Payload("b", 0, db, 3)).ok());
  Join(*two, "a");  // sessions are per service
  Join(*two, "b");
  ASSERT_TRUE(two->Push(Payload("b", 0, db, 3)).ok());
  ASSERT_TRUE(two->Push(Payload("a", 0, da, 7)).ok());
  EXPECT_EQ(one->params_hash(), two->params_hash());
}

// A contribution of no tokens (an island whose loss-spike guard dropped every step since its
// push: it is there with nothing) or of no change (all zero) is left out of its round: it would
// only shrink the others' shares, or count tokens that moved nothing. A round of nothing else
// commits a zero update, marked as no progress, with no tokens. Async answers it unapplied.
TEST_F(SyncServerTest, AContributionOfNoTokensOrNoChangeIsVoided) {
  options_.num_data_streams = 2;
  options_.optimizer.name = "sgd";
  options_.optimizer.lr = 1.0;
  options_.optimizer.momentum = 0;
  auto s = Make();
  std::vector<CommittedRound> rounds;
  s->SetCommitListener([&](const CommittedRound& r) { rounds.push_back(r); });
  Join(*s, "a");
  Join(*s, "b");
  const std::vector<float> theta0 = s->params();
  ASSERT_TRUE(s->Push(Payload("a", 0, {5, 5, 5, 5}, 0)).ok());
  ASSERT_TRUE(s->Push(Payload("b", 0, {2, 2, 2, 2}, 100)).ok());
  ASSERT_TRUE(s->Push(Payload("a", 1, {0, 0, 0, 0}, 100)).ok());
  ASSERT_TRUE(s->Push(Payload("b", 1, {1, 1, 1, 1}, 100)).ok());
  ASSERT_TRUE(s->Push(Payload("a", 2, {0, 0, 0, 0}, 0)).ok());
  ASSERT_TRUE(s->Push(Payload("b", 2, {0, 0, 0, 0}, 100)).ok());
  ASSERT_EQ(rounds.size(), 3u);
  const std::vector<float> theta3 = s->params();
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(theta3[i], theta0[i] - 3.0f) << i;  // b's alone
  EXPECT_EQ(rounds[0].voided, std::vector<std::string>{"a"});
  EXPECT_EQ(rounds[0].tokens, 100u);
  EXPECT_EQ(rounds[1].voided, std::vector<std::string>{"a"});
  EXPECT_TRUE(rounds[1].progress);
  EXPECT_EQ(rounds[2].voided, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(rounds[2].progress);
  EXPECT_EQ(rounds[2].tokens, 0u);

  options_.async = true;
  auto async = Make();
  Join(*async, "a");
  Join(*async, "b");
  const std::vector<float> before = async->params();
  for (const auto& [island, delta, tokens] :
       {std::tuple{"a", 1.0f, uint64_t(0)}, std::tuple{"b", 0.0f, uint64_t(100)}}) {
    auto r = async->Push(Payload(island, 0, {delta, delta, delta, delta}, tokens));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->version(), 0u);
  }
  EXPECT_EQ(async->params(), before);
  EXPECT_EQ(async->committed_rounds(), 0u);
}

TEST_F(SyncServerTest, BadContributionsAreRefusedAndStateIsUntouched) {
  options_.num_data_streams = 2;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  const auto before = s->params();
  struct Case {
    std::vector<pb::PushRequest> payload;
    absl::StatusCode code;
    const char* message;
  };
  auto wrong_run = Payload("a", 0, {1, 1, 1, 1});
  wrong_run[0].mutable_chunk()->mutable_header()->set_run_id("other");
  auto wrong_fragment = Payload("a", 0, {1, 1, 1, 1});
  wrong_fragment[0].mutable_chunk()->mutable_header()->set_fragment(3);
  auto wrong_size = Payload("a", 0, {1, 1, 1});
  Case cases[] = {
      {Payload("stranger", 0, {1, 1, 1, 1}), absl::StatusCode::kPermissionDenied, "not a member"},
      {Payload("a", 5, {1, 1, 1, 1}), absl::StatusCode::kFailedPrecondition, "unknown"},
      {wrong_run, absl::StatusCode::kNotFound, "unknown run"},
      {wrong_fragment, absl::StatusCode::kNotFound, "unknown fragment 3"},
      {wrong_size, absl::StatusCode::kInvalidArgument, "fragment has 4 elements"},
      {{}, absl::StatusCode::kInvalidArgument, "no chunks"},
  };
  for (auto& c : cases) {
    auto r = s->Push(c.payload);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->Push(Payload("a", 0, {1, 1, 1, 1})).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->params(), before);
  ASSERT_TRUE(s->Push(Payload("b", 0, {1, 1, 1, 1})).ok());
  // Pushed again after its round committed (its answer lost): the service has it already.
  auto again = s->Push(Payload("a", 0, {1, 1, 1, 1}));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("has already contributed to round 0"));
}

TEST_F(SyncServerTest, DeadlineCommitsWithMinIslandsAndLeaveCompletesARound) {
  options_.min_islands = 1;
  options_.round_timeout_s = 5;
  options_.lease_s = 100;  // this test is about deadlines, not leases
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  Join(*s, "c");
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1})).ok());
  s->Tick(absl::Now());
  EXPECT_EQ(s->round(), 0u);  // deadline not reached
  s->Tick(absl::Now() + absl::Seconds(6));
  EXPECT_EQ(s->round(), 1u);  // b and c were too late
  ASSERT_TRUE(s->Push(Payload("b", 1, {1, 1, 1, 1})).ok());
  ASSERT_TRUE(s->Push(Payload("c", 1, {1, 1, 1, 1})).ok());
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("a");
  leave.set_session(sessions_["a"]);
  ASSERT_TRUE(s->Leave(leave).ok());
  EXPECT_EQ(s->round(), 2u);  // b and c were everyone left
  EXPECT_EQ(s->GetState().islands_size(), 2);
}

TEST_F(SyncServerTest, TheFirstRoundWaitsForEveryIslandOfTheRun) {
  options_.num_data_streams = 2;
  options_.round_timeout_s = 5;
  auto s = Make();
  Join(*s, "a");
  ASSERT_TRUE(s->Push(Payload("a", 0, {1, 1, 1, 1})).ok());
  s->Tick(absl::Now());
  EXPECT_EQ(s->round(), 0u);  // b has not joined yet
  Join(*s, "b");
  ASSERT_TRUE(s->Push(Payload("b", 0, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->round(), 1u);
  // From then on, every current member is enough.
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("b");
  leave.set_session(sessions_["b"]);
  ASSERT_TRUE(s->Leave(leave).ok());
  ASSERT_TRUE(s->Push(Payload("a", 1, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->round(), 2u);
}

// Every call after the join names an island and carries its session credential: holding the run
// token (or another island's credential) is not enough to act as an island.
TEST_F(SyncServerTest, AnIslandCannotActAsAnother) {
  options_.num_data_streams = 2;
  options_.config_hash = 0x1234;
  auto s = Make();
  pb::JoinRequest other_model;
  other_model.set_run_id("run");
  other_model.set_name("a");
  other_model.set_config_hash(0x9999);
  auto refused = s->Join(other_model);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("[model] config differs"));
  options_.config_hash = 0;
  s = Make();
  Join(*s, "a");
  Join(*s, "b");
  const auto before = s->params();
  const auto epoch = s->GetState().membership_epoch();
  auto forged = Payload("a", 0, {1, 1, 1, 1});
  forged[0].set_session(sessions_["b"]);
  EXPECT_EQ(s->Push(forged).status().code(), absl::StatusCode::kUnauthenticated);
  forged[0].clear_session();
  EXPECT_EQ(s->Push(forged).status().code(), absl::StatusCode::kUnauthenticated);
  pb::HeartbeatRequest beat;
  beat.set_run_id("run");
  beat.set_island_id("a");
  beat.set_session(sessions_["b"]);
  EXPECT_EQ(s->Heartbeat(beat).status().code(), absl::StatusCode::kUnauthenticated);
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("a");
  leave.set_session(sessions_["b"]);
  EXPECT_EQ(s->Leave(leave).code(), absl::StatusCode::kUnauthenticated);
  pb::FetchStateRequest fetch;
  fetch.set_run_id("run");
  fetch.set_island_id("a");
  fetch.set_session("0123456789abcdef0123456789abcdef");
  EXPECT_EQ([&] {
    InProcessTransport t(s.get());
    return atl::testing::FetchAll(t, fetch);
  }().status().code(),
            absl::StatusCode::kUnauthenticated);
  pb::UpdateRequest update;
  update.set_run_id("run");
  update.set_island_id("a");
  EXPECT_EQ(s->AwaitUpdate(update, absl::Now()).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(s->num_members(), 2u);
  EXPECT_EQ(s->GetState().membership_epoch(), epoch);
  EXPECT_EQ(s->params(), before);
  // The real credential works.
  leave.set_session(sessions_["a"]);
  EXPECT_TRUE(s->Leave(leave).ok());
}

// A member that pushes huge finite values (every element 3e38), values beyond the absolute bound,
// a norm far beyond its fragment's or an absurd token count is refused; nothing changes.
TEST_F(SyncServerTest, OutOfBoundsContributionsAreRefusedAndChangeNothing) {
  options_.num_data_streams = 2;
  options_.max_update_norm = 10;
  options_.max_update_value = 1000;
  options_.sync_every = 10;
  options_.tokens_per_step = 10;  // a round of 10 steps weighs at most 100 tokens
  auto s = Make();  // parameter norm sqrt(30) = 5.48
  Join(*s, "a");
  Join(*s, "b");
  const auto before = s->params();
  const auto hash = s->params_hash();
  struct Case {
    std::vector<pb::PushRequest> payload;
    const char* message;
  } cases[] = {
      {Payload("a", 0, {3e38f, 3e38f, 3e38f, 3e38f}), "exceeds outer.max_update_value"},
      {Payload("a", 0, {0, 0, 1000.5f, 0}), "exceeds outer.max_update_value"},
      {Payload("a", 0, {30, 30, 30, -30}), "times the fragment's parameter norm"},
      {Payload("a", 0, {1, 1, 1, 1}, uint64_t(1) << 60), "claims 1152921504606846976 tokens"},
  };
  for (auto& c : cases) {
    auto r = s->Push(c.payload);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    EXPECT_EQ(s->params(), before);
    EXPECT_EQ(s->params_hash(), hash);
  }
  // Inside the bounds: accepted, and the round commits as usual.
  ASSERT_TRUE(s->Push(Payload("a", 0, {20, 20, 20, -20}, 100)).ok());
  ASSERT_TRUE(s->Push(Payload("b", 0, {1, 1, 1, 1})).ok());
  EXPECT_EQ(s->round(), 1u);
}

// Without bounds, contributions whose combination would overflow the parameters are left out one
// by one (the round commits without them, the process stays up, nothing non-finite is ever
// applied); in async mode such a contribution is refused.
TEST_F(SyncServerTest, AnUpdateThatWouldOverflowIsNeverApplied) {
  options_.num_data_streams = 3;
  options_.max_update_norm = 0;
  options_.max_update_value = 0;
  auto s = Make({3e38f, -3e38f, 1, 2});
  std::vector<std::string> events;
  s->SetEventListener([&](const std::string& e) { events.push_back(e); });
  for (const char* i : {"a", "b", "c"}) Join(*s, i);
  ASSERT_TRUE(s->Push(Payload("a", 0, {-3e38f, 0, 0, 0})).ok());      // 3e38 - (-3e38): overflow
  ASSERT_TRUE(s->Push(Payload("b", 0, {0, 3e38f, 0, 0}, 1)).ok());    // with a: still overflows
  ASSERT_TRUE(s->Push(Payload("c", 0, {0, 0, 0.5f, 0.5f}, 5)).ok());  // healthy
  EXPECT_EQ(s->round(), 1u);
  const auto p = s->params();
  for (float v : p) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(p[2], 0.5f);  // c's contribution alone was applied (outer SGD, lr 1)
  EXPECT_EQ(p[3], 1.5f);
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events[0], HasSubstr("non-finite"));
  auto round = s->AwaitRound(0, absl::Now());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ((*round)->contributors, std::vector<std::string>{"c"});
  EXPECT_EQ((*round)->dropped, (std::vector<std::string>{"a", "b"}));

  options_.async = true;
  options_.num_data_streams = 1;
  auto async = Make({3e38f, 0, 0, 0});
  Join(*async, "a");
  const auto hash = async->params_hash();
  auto r = async->Push(Payload("a", 0, {-3e38f, 0, 0, 0}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("non-finite"));
  EXPECT_EQ(async->params_hash(), hash);
  EXPECT_EQ(async->round(), 0u);
  EXPECT_TRUE(async->Push(Payload("a", 0, {1, 0, 0, 0})).ok());
}

TEST_F(SyncServerTest, JoinRefusesDuplicatesAndHandsOutDisjointStreams) {
  auto s = Make();
  pb::JoinRequest r;
  r.set_run_id("run");
  r.set_name("a");
  EXPECT_EQ(s->Join(r)->data_stream(), 0u);
  EXPECT_EQ(s->Join(r).status().code(), absl::StatusCode::kAlreadyExists);
  r.set_name("b");
  EXPECT_EQ(s->Join(r)->data_stream(), 1u);
  r.set_name("c");
  EXPECT_EQ(s->Join(r)->data_stream(), 2u);
  r.set_name("d");
  EXPECT_EQ(s->Join(r).status().code(), absl::StatusCode::kResourceExhausted);
  r.set_run_id("other");
  EXPECT_EQ(s->Join(r).status().code(), absl::StatusCode::kNotFound);
}

// Island a is two ranks, each owning two ranges of the fragment and pushing them in its own stream;
// island b is one rank. Every rank's ranges stay bit-identical with the service's after every
// round, with every codec; with fp32 the service ends exactly where it would with a one-rank a.
TEST_F(SyncServerTest, RanksPushTheRangesTheyOwnAndStayBitIdentical) {
  const std::vector<float> init = TwoIslandsOf1000();
  const auto& r0 = kRank0Ranges;
  const auto& r1 = kRank1Ranges;
  auto local = [](const std::vector<float>& global, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                  int round, float sign) {
    std::vector<float> v;
    for (const auto& [b, e] : ranges) {
      for (uint64_t i = b; i < e; ++i) v.push_back(0);
    }
    for (size_t i = 0; i < v.size(); ++i) v[i] = global[i] + sign * 0.01f * std::cos(float(i + round));
    return v;
  };
  auto slice = [](const std::vector<float>& all, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
    std::vector<float> v;
    for (const auto& [b, e] : ranges) v.insert(v.end(), all.begin() + long(b), all.begin() + long(e));
    return v;
  };
  std::vector<float> whole_result;
  for (const char* name : {"fp32", "fp4_e2m1"}) {
    for (bool sharded : {true, false}) {
      SCOPED_TRACE(std::string(name) + (sharded ? " sharded" : " whole"));
      options_.codec = *compression::ParseCodec(name);
      auto s = Make(init);
      InProcessTransport t0(s.get()), t1(s.get()), tb(s.get());
      Join(*s, "a");
      Join(*s, "b");
      IslandSyncOptions so;
      so.codec = options_.codec;
      so.chunk_bytes = 128;
      so.ranges = sharded ? r0 : std::vector<std::pair<uint64_t, uint64_t>>{};
      IslandSync a0(&t0, "run", Id("a"), 1000, so);
      so.ranges = r1;
      IslandSync a1(&t1, "run", Id("a"), 1000, so);
      so.ranges = {};
      IslandSync b(&tb, "run", Id("b"), 1000, so);
      ASSERT_TRUE(a0.FetchGlobal().ok() && a1.FetchGlobal().ok() && b.FetchGlobal().ok());
      EXPECT_EQ(a0.global(), slice(init, sharded ? r0 : std::vector<std::pair<uint64_t, uint64_t>>{{0, 1000}}));
      for (int round = 0; round < 4; ++round) {
        absl::StatusOr<RoundOutcome> ra0, ra1, rb;
        std::vector<float> la = sharded ? local(a0.global(), r0, round, 1) : std::vector<float>();
        if (!sharded) {
          // One rank holding everything: the same local values, whole.
          std::vector<float> l0 = local(slice(a0.global(), r0), r0, round, 1);
          std::vector<float> l1 = local(slice(a0.global(), r1), r1, round, 1);
          la = a0.global();
          size_t k = 0;
          for (const auto& [bg, e] : r0) for (uint64_t i = bg; i < e; ++i) la[i] = l0[k++];
          k = 0;
          for (const auto& [bg, e] : r1) for (uint64_t i = bg; i < e; ++i) la[i] = l1[k++];
        }
        std::thread t_a0([&] { ra0 = a0.SyncRound(la, 100); });
        std::thread t_a1([&] {
          if (sharded) ra1 = a1.SyncRound(local(a1.global(), r1, round, 1), 100);
        });
        rb = b.SyncRound(local(b.global(), {{0, 1000}}, round, -1), 60);
        t_a0.join();
        t_a1.join();
        ASSERT_TRUE(ra0.ok() && rb.ok()) << ra0.status() << rb.status();
        EXPECT_FALSE(ra0->resynced);
        EXPECT_EQ(ra0->contributors, 2u);
        if (sharded) {
          ASSERT_TRUE(ra1.ok()) << ra1.status();
          EXPECT_FALSE(ra1->resynced);
          EXPECT_EQ(a0.global(), slice(s->params(), r0));
          EXPECT_EQ(a1.global(), slice(s->params(), r1));
        }
        EXPECT_EQ(b.global(), s->params());
      }
      if (std::string(name) == "fp32") {
        if (sharded) {
          whole_result = s->params();
        } else {
          EXPECT_EQ(s->params(), whole_result);  // the same numbers, however they travelled
        }
      }
    }
  }
}

// The parts of one island's contribution (its ranks' pushes) are checked against each other: a part
// sent again is a duplicate, overlapping parts and parts disagreeing on the tokens are refused; in
// async mode every part is answered with the version the whole contribution made.
TEST_F(SyncServerTest, PartsOfAContributionAreCheckedAgainstEachOther) {
  auto part = [&](const std::string& island, uint64_t round, uint64_t offset,
                  std::vector<float> v, uint64_t tokens) {
    auto chunks = *EncodeChunks({"run", island, round, 0}, {compression::Codec::kFp32, 0}, v.data(),
                                offset, v.size(), 4);
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(tokens);
    }
    out[0].set_session(sessions_[island]);
    return out;
  };
  options_.num_data_streams = 2;
  auto s = Make();
  Join(*s, "a");
  Join(*s, "b");
  ASSERT_TRUE(s->Push(part("a", 0, 0, {1, 1}, 10)).ok());
  EXPECT_EQ(s->Push(part("a", 0, 0, {1, 1}, 10)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s->Push(part("a", 0, 1, {1, 1}, 10)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto tokens = s->Push(part("a", 0, 2, {1, 1}, 11));
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tokens.status().message()), HasSubstr("disagree on the tokens"));
  ASSERT_TRUE(s->Push(Payload("b", 0, {3, 3, 3, 3})).ok());
  EXPECT_EQ(s->round(), 0u);  // a's contribution is not complete yet
  ASSERT_TRUE(s->Push(part("a", 0, 2, {1, 1}, 10)).ok());
  EXPECT_EQ(s->round(), 1u);
  EXPECT_EQ(s->params(), (std::vector<float>{-1, 0, 1, 2}));  // lr 1: theta - (1 + 3) / 2

  options_.async = true;
  options_.num_data_streams = 1;
  auto async = Make();
  Join(*async, "a");
  absl::StatusOr<pb::PushResponse> first;
  std::thread rank0([&] { first = async->Push(part("a", 0, 0, {1, 1}, 10)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(async->round(), 0u);  // rank 0 waits for the rest of its island's contribution
  auto second = async->Push(part("a", 0, 2, {1, 1}, 10));
  rank0.join();
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  EXPECT_EQ(first->version(), 1u);
  EXPECT_EQ(second->version(), 1u);
}

// A background queue runs its tasks in order on a thread of its own; destroyed, it waits for the
// task it is running.
TEST(BackgroundQueueTest, RunsTasksInOrderOffTheCallersThread) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> ran;
  std::vector<std::thread::id> threads;
  {
    BackgroundQueue queue;
    for (int i = 0; i < 5; ++i) {
      queue.Post([&, i] {
        std::lock_guard<std::mutex> lock(mu);
        ran.push_back(i);
        threads.push_back(std::this_thread::get_id());
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return ran.size() == 5; }));
  }
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4}));
  for (const auto& id : threads) EXPECT_NE(id, std::this_thread::get_id());
  std::atomic<bool> started{false}, finished{false};
  {
    BackgroundQueue queue;
    queue.Post([&] {
      started = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      finished = true;
    });
    for (int i = 0; i < 1000 && !started; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(started);
  }
  EXPECT_TRUE(finished);
}

}  // namespace
}  // namespace atl::outer
