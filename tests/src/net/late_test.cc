// Late contributions, partial pushes and the grace window of sync rounds, through the real gRPC
// service on loopback (outer/service/rounds.h, outer/base/grace.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "outer/base/payload.h"
#include "outer/island/island_sync.h"
#include "src/net/grpc_server.h"
#include "src/net/grpc_transport.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

// Late contributions (outer.max_staleness = 1), through the real gRPC service: round 0 commits at
// its deadline without island c; c's push for round 0 then is folded into round 1 at weight
// 1 / (1 + 1), its share of the step capped at that over the round's tokens, recorded as stale, and c's copy, having applied round 0 as usual, stays
// bit-identical with the service's every round. A push two rounds stale is refused by name.
class GrpcLateTest : public ::testing::Test {
 protected:
  // The service's options; a test's own fixture may change them.
  virtual outer::SyncServerOptions Options() const {
    outer::SyncServerOptions o;
    o.run_id = "run";
    o.num_data_streams = 3;
    o.min_islands = 2;
    o.round_timeout_s = 0.05;
    o.sync_max_staleness = 1;
    o.optimizer.name = "sgd";  // u = lr x the weighted mean: the fold's weight shows in the result
    o.optimizer.lr = 1.0;
    o.optimizer.momentum = 0;
    return o;
  }
  void SetUp() override {
    const outer::SyncServerOptions o = Options();
    sync_ = std::make_unique<outer::SyncServer>(o, outer::FragmentLayout{{"w"}, {4}},
                                                std::vector<float>{1, 2, 3, 4});
    sync_->SetCommitListener([this](const outer::CommittedRound& r) {
      std::lock_guard<std::mutex> lock(mu_);
      committed_.push_back(r);
    });
    GrpcServerOptions so;
    so.listen = "127.0.0.1:0";
    so.token = "t";
    server_ = *GrpcServer::Start(sync_.get(), so);
    GrpcTransportOptions t;
    t.target = server_->address();
    t.token = "t";
    t.rpc_timeout_s = 10;
    t.round_timeout_s = 10;
    client_ = *GrpcTransport::Create(t);
    pb::JoinRequest j;
    j.set_run_id("run");
    for (const char* name : {"a", "b", "c"}) {
      j.set_name(name);
      sessions_[name] = client_->Join(j)->session();
    }
  }
  absl::Status Push(const std::string& island, uint64_t round, std::vector<float> delta,
                    uint64_t tokens, uint64_t step = 0) {
    auto chunks = *outer::EncodeChunks({"run", island, round, 0}, {compression::Codec::kFp32, 0},
                                       delta.data(), 0, delta.size(), delta.size(), 8);
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(tokens);
      out[i].set_step(step);
    }
    out[0].set_session(sessions_[island]);
    return testing::PushAll(*client_, out).status();
  }
  // Waits (bounded) for the service to reach `round`, and its listener to have heard of it.
  void AwaitRound(uint64_t round) {
    for (int i = 0; i < 400 && (sync_->round() < round || Committed().size() < round); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(sync_->round(), round);
  }
  std::unique_ptr<outer::IslandSync> IslandOf(const std::string& name) {
    auto sync = std::make_unique<outer::IslandSync>(
        client_.get(), "run", std::make_shared<outer::IslandIdentity>(name, sessions_[name]), 4);
    EXPECT_TRUE(sync->FetchGlobal().ok());
    return sync;
  }
  std::unique_ptr<outer::SyncServer> sync_;
  std::vector<outer::CommittedRound> Committed() {
    std::lock_guard<std::mutex> lock(mu_);
    return committed_;
  }
  std::mutex mu_;
  std::vector<outer::CommittedRound> committed_;  // under mu_
  std::map<std::string, std::string> sessions_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<GrpcTransport> client_;
};

TEST_F(GrpcLateTest, ALatePushIsFoldedIntoTheNextRoundWithItsWeight) {
  auto c = IslandOf("c");
  const std::vector<float> theta0 = sync_->params();
  ASSERT_TRUE(Push("a", 0, {1, 1, 1, 1}, 100).ok());
  ASSERT_TRUE(Push("b", 0, {3, 3, 3, 3}, 100).ok());
  AwaitRound(1);  // at the deadline, without c
  const std::vector<float> theta1 = sync_->params();
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(theta1[i], theta0[i] - 2.0f);
  // c trained round 0 from theta0 to theta0 - 8: its pseudo-gradient is 8, made for round 0.
  std::vector<float> local(4);
  for (size_t i = 0; i < 4; ++i) local[i] = theta0[i] - 8.0f;
  auto late = c->SyncRound(local, 100);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->late);
  EXPECT_EQ(late->staleness, 1u);
  EXPECT_FALSE(late->resynced);
  EXPECT_EQ(c->round(), 1u);
  EXPECT_EQ(c->global(), theta1);  // it applied round 0's committed update, bit for bit
  // Round 1: a, b and c on time (2 each), c's late 8 at 100 / 2 tokens.
  ASSERT_TRUE(Push("a", 1, {2, 2, 2, 2}, 100).ok());
  ASSERT_TRUE(Push("b", 1, {2, 2, 2, 2}, 100).ok());
  for (size_t i = 0; i < 4; ++i) local[i] = theta1[i] - 2.0f;
  auto on_time = c->SyncRound(local, 100);
  ASSERT_TRUE(on_time.ok()) << on_time.status();
  EXPECT_FALSE(on_time->late);
  const std::vector<float> theta2 = sync_->params();
  EXPECT_EQ(c->global(), theta2);
  EXPECT_EQ(c->global_hash(), sync_->params_hash());
  // The on-time 2s at their weights against c's late 8 at 100 / 2 tokens (as before); c's late 8
  // moves the model at most (100 / 2) / 400 of it, its tokens at 1 / (1 + 1) over the round's.
  const float mean = (100 * 2.0f + 100 * 2.0f + 100 * 2.0f) / 350.0f + 50 * 8.0f / 400.0f;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(theta2[i], theta1[i] - mean, 1e-5) << i;
  const auto committed = Committed();
  ASSERT_EQ(committed.size(), 2u);
  EXPECT_TRUE(committed[0].stale_contributors.empty());
  EXPECT_EQ(committed[1].contributors, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(committed[1].stale_contributors, (std::vector<std::string>{"c"}));
  EXPECT_EQ(committed[1].stale_tokens, 100u);
  EXPECT_EQ(committed[1].tokens, 400u);  // every token that reached the model, whole
}

// The chaos run's round 53: a late push nearly alone in its round (the on-time islands trained a
// step each, 1 token) moved the model as far as its own round would have, on top of the round that
// had moved it from the same base. Its effect is bounded by its staleness, whoever else pushed:
// at most 1 / (1 + 1) of its own round's step.
TEST_F(GrpcLateTest, ALatePushNearlyAloneMovesTheModelNoFartherThanItsStalenessAllows) {
  auto c = IslandOf("c");
  const std::vector<float> theta0 = sync_->params();
  ASSERT_TRUE(Push("a", 0, {1, 1, 1, 1}, 100).ok());
  ASSERT_TRUE(Push("b", 0, {1, 1, 1, 1}, 100).ok());
  AwaitRound(1);
  const std::vector<float> theta1 = sync_->params();
  std::vector<float> local(4);
  for (size_t i = 0; i < 4; ++i) local[i] = theta0[i] - 8.0f;  // its own round's step: 8
  auto late = c->SyncRound(local, 100);
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_TRUE(late->late);
  ASSERT_TRUE(Push("a", 1, {1e-3f, 1e-3f, 1e-3f, 1e-3f}, 1).ok());
  ASSERT_TRUE(Push("b", 1, {1e-3f, 1e-3f, 1e-3f, 1e-3f}, 1).ok());
  for (size_t i = 0; i < 4; ++i) local[i] = theta1[i] - 1e-3f;
  ASSERT_TRUE(c->SyncRound(local, 1).ok());
  const std::vector<float> theta2 = sync_->params();
  // Before: (3 x 1e-3 + 50 x 8) / 53 = 7.5, 94% of its own step. Now its share is capped at
  // (100 / 2) / 103 of the round's tokens.
  const float expected = 3 * 1e-3f / 53.0f + 50 * 8.0f / 103.0f;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(theta1[i] - theta2[i], expected, 1e-5) << i;
    EXPECT_LE(theta1[i] - theta2[i], 8.0f / 2) << i;
  }
  EXPECT_EQ(c->global_hash(), sync_->params_hash());
}

TEST_F(GrpcLateTest, APushTwoRoundsStaleIsRefusedByName) {
  for (uint64_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(Push("a", r, {1, 1, 1, 1}, 100).ok());
    ASSERT_TRUE(Push("b", r, {1, 1, 1, 1}, 100).ok());
    AwaitRound(r + 1);
  }
  const auto before = sync_->params();
  const absl::Status stale = Push("c", 0, {5, 5, 5, 5}, 100);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()),
              HasSubstr("round 0 of fragment 0 has already committed, and it would be 2 rounds "
                        "stale (outer.max_staleness = 1)"));
  // One round stale is taken; a second late push of the same island waits no second time.
  ASSERT_TRUE(Push("c", 1, {5, 5, 5, 5}, 100).ok());
  EXPECT_EQ(Push("c", 1, {5, 5, 5, 5}, 100).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(sync_->params(), before);  // folded at the next commit, not before
}

// A push pushed again after its round committed with it (its answer was lost: a cut link, a
// rejoin) is the service's already: ALREADY_EXISTS, never a late contribution folded twice.
TEST_F(GrpcLateTest, APushAgainOfARecordedRoundIsNotFoldedTwice) {
  for (const char* island : {"a", "b", "c"}) ASSERT_TRUE(Push(island, 0, {1, 1, 1, 1}, 100).ok());
  AwaitRound(1);
  const absl::Status again = Push("c", 0, {1, 1, 1, 1}, 100);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("has already contributed to round 0"));
  for (const char* island : {"a", "b", "c"}) ASSERT_TRUE(Push(island, 1, {1, 1, 1, 1}, 100).ok());
  AwaitRound(2);
  EXPECT_TRUE(Committed()[1].stale_contributors.empty());
  EXPECT_EQ(Committed()[1].tokens, 300u);
}

// A partial contribution (an island leaving with the steps it trained since its last push:
// IslandSync::Contribute) is recorded without waiting for the round, with its own token claim;
// the round commits with it. A claim beyond the steps of the round is refused by name, and the
// state stays untouched.
class GrpcPartialTest : public GrpcLateTest {
 protected:
  outer::SyncServerOptions Options() const override {
    outer::SyncServerOptions o = GrpcLateTest::Options();
    o.round_timeout_s = 30;
    o.sync_every = 4;
    o.total_inner_steps = 40;
    o.tokens_per_step = 10;  // a round of 4 steps claims at most 40 tokens (one rank)
    return o;
  }
};

TEST_F(GrpcPartialTest, APartialPushCountsItsStepsAndNoMore) {
  auto c = IslandOf("c");
  const std::vector<float> theta0 = sync_->params();
  std::vector<float> local(4);
  for (size_t i = 0; i < 4; ++i) local[i] = theta0[i] - 3.0f;
  // Too many tokens for round 0 (5 steps of 10 > its 4): refused, nothing recorded.
  auto greedy = c->Contribute(local, 50, 5);
  EXPECT_EQ(greedy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(greedy.status().message()), HasSubstr("claims 50 tokens"));
  // Its 3 steps: taken, and the round goes on waiting for a and b.
  auto partial = c->Contribute(local, 30, 3);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_FALSE(partial->late());
  EXPECT_EQ(c->round(), 0u);  // nothing applied: it does not wait
  EXPECT_EQ(sync_->round(), 0u);
  ASSERT_TRUE(Push("a", 0, {1, 1, 1, 1}, 40).ok());
  ASSERT_TRUE(Push("b", 0, {1, 1, 1, 1}, 40).ok());
  AwaitRound(1);
  const auto committed = Committed();
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_EQ(committed[0].contributors, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(committed[0].tokens, 110u);
  const std::vector<float> theta1 = sync_->params();
  const float mean = (40 * 1.0f + 40 * 1.0f + 30 * 3.0f) / 110.0f;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(theta1[i], theta0[i] - mean, 1e-5) << i;
}

// A push made past the run's last inner step (step 2^64-1 made the round stop waiting for its
// island) is refused by name, and changes nothing.
TEST_F(GrpcPartialTest, APushPastTheRunsLastStepIsRefused) {
  const std::vector<float> theta0 = sync_->params();
  const absl::Status absurd = Push("a", 0, {1, 1, 1, 1}, 40, UINT64_MAX);
  EXPECT_EQ(absurd.code(), absl::StatusCode::kInvalidArgument) << absurd;
  EXPECT_THAT(std::string(absurd.message()),
              HasSubstr("pushed at inner step 18446744073709551615, past the run's last step 40"));
  ASSERT_TRUE(Push("a", 0, {1, 1, 1, 1}, 40, 4).ok());
  ASSERT_TRUE(Push("b", 0, {1, 1, 1, 1}, 40, 4).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(sync_->round(), 0u);  // it still waits for c
  EXPECT_EQ(sync_->params(), theta0);
}

// What the ledger holds for an island is what the service accepted: a push refused for its claim
// (2^64-1 tokens) leaves it as it was.
TEST_F(GrpcPartialTest, ARefusedClaimLeavesTheLedgerUnchanged) {
  pb::HeartbeatRequest beat;
  beat.set_run_id("run");
  beat.set_island_id("c");
  beat.set_session(sessions_["c"]);
  beat.mutable_telemetry()->set_process(7);
  beat.mutable_telemetry()->set_tokens_trained(40);
  ASSERT_TRUE(client_->Heartbeat(beat).ok());
  auto account = [&] {
    for (const auto& i : sync_->GetStatus().islands) {
      if (i.island_id == "c") return i.tokens;
    }
    return outer::TokenAccount{};
  };
  const outer::TokenAccount before = account();
  ASSERT_EQ(before.trained, 40u);  // the ledger knows c
  const absl::Status greedy = Push("c", 0, {1, 1, 1, 1}, UINT64_MAX, 4);
  EXPECT_EQ(greedy.code(), absl::StatusCode::kInvalidArgument) << greedy;
  const outer::TokenAccount after = account();
  EXPECT_EQ(after.trained, before.trained);
  EXPECT_EQ(after.on_time, before.on_time);
  EXPECT_TRUE(after.refused.empty());
  ASSERT_TRUE(Push("c", 0, {1, 1, 1, 1}, 40, 4).ok());
  EXPECT_EQ(account().trained, 40u);
}

// An island back after 5 rounds away may claim the 6 rounds it trained since its last recorded
// contribution (its pseudo-gradient holds them), but they weigh as one round: more would count
// its work twice and take the round from the islands that trained it (it took 67%). The claim is
// flagged, and the ledger has it whole.
TEST_F(GrpcPartialTest, ARejoinClaimingSixRoundsIsFlaggedAndWeighsOneRound) {
  for (const char* island : {"a", "b", "c"}) ASSERT_TRUE(Push(island, 0, {1, 1, 1, 1}, 40, 4).ok());
  AwaitRound(1);
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("c");
  leave.set_session(sessions_["c"]);
  ASSERT_TRUE(client_->Leave(leave).ok());
  for (uint64_t r = 1; r < 6; ++r) {
    ASSERT_TRUE(Push("a", r, {1, 1, 1, 1}, 40, 4 * (r + 1)).ok());
    ASSERT_TRUE(Push("b", r, {1, 1, 1, 1}, 40, 4 * (r + 1)).ok());
    AwaitRound(r + 1);
  }
  pb::JoinRequest j;
  j.set_run_id("run");
  j.set_name("c");
  sessions_["c"] = client_->Join(j)->session();
  const std::vector<float> theta6 = sync_->params();
  ASSERT_TRUE(Push("c", 6, {7, 7, 7, 7}, 240, 28).ok());  // 6 rounds of 4 steps of 10 tokens
  ASSERT_TRUE(Push("a", 6, {1, 1, 1, 1}, 40, 28).ok());
  ASSERT_TRUE(Push("b", 6, {1, 1, 1, 1}, 40, 28).ok());
  AwaitRound(7);
  const std::vector<float> theta7 = sync_->params();
  const float mean = (40 * 1.0f + 40 * 1.0f + 40 * 7.0f) / 120.0f;  // was (80 + 240 x 7) / 320
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(theta6[i] - theta7[i], mean, 1e-5) << i;
  EXPECT_EQ(Committed().back().tokens, 320u);
  uint32_t flagged = 0;
  for (const auto& i : sync_->GetStatus().islands) {
    if (i.island_id == "c") flagged = i.flagged_claims;
  }
  EXPECT_GE(flagged, 1u);
}

// The grace window (outer.grace = "adaptive"): after rounds in which the three islands arrive
// together, a round whose third island is three round periods late commits once its quorum (2)
// is in and the window has passed, long before the fixed deadline; the straggler's push then is
// folded into the next round, late. A round never commits before its quorum, window or not.
class GrpcGraceTest : public GrpcLateTest {
 protected:
  outer::SyncServerOptions Options() const override {
    outer::SyncServerOptions o = GrpcLateTest::Options();
    o.round_timeout_s = 60;  // the fixed deadline, never reached here
    o.grace = {outer::GraceSpec::Mode::kAdaptive, 0};
    o.grace_floor_s = 0.05;
    return o;
  }
  static constexpr double kPeriodS = 0.2;
  void Round(uint64_t r, const std::vector<std::string>& islands) {
    for (const auto& island : islands) ASSERT_TRUE(Push(island, r, {1, 1, 1, 1}, 100).ok());
  }
};

TEST_F(GrpcGraceTest, AStragglerThreeTimesSlowerIsFoldedLateAndQuorumIsKept) {
  // Rounds 0-4: everyone, a round period apart (round 0 teaches nothing: it waits for the start).
  for (uint64_t r = 0; r < 5; ++r) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kPeriodS));
    Round(r, {"a", "b", "c"});
    AwaitRound(r + 1);
  }
  // Round 5: c is three periods late. The round commits without it after the window.
  std::this_thread::sleep_for(std::chrono::duration<double>(kPeriodS));
  const auto t0 = std::chrono::steady_clock::now();
  Round(5, {"a", "b"});
  AwaitRound(6);
  const double closed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(closed_s, 3 * kPeriodS);
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * kPeriodS - closed_s));
  ASSERT_TRUE(Push("c", 5, {1, 1, 1, 1}, 100).ok());  // late: into round 6
  auto committed = Committed();
  ASSERT_EQ(committed.size(), 6u);
  EXPECT_EQ(committed[5].contributors, (std::vector<std::string>{"a", "b"}));
  EXPECT_GE(committed[5].grace_s, 0.05);
  EXPECT_LT(committed[5].grace_s, 3 * kPeriodS);
  EXPECT_LT(committed[4].grace_s, 3 * kPeriodS);  // complete rounds have a window too
  // Round 6: a alone waits past any window (quorum 2), then commits with b after the window,
  // c's late push folded in.
  Round(6, {"a"});
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kPeriodS));
  EXPECT_EQ(sync_->round(), 6u);
  Round(6, {"b"});
  AwaitRound(7);
  committed = Committed();
  ASSERT_EQ(committed.size(), 7u);
  EXPECT_EQ(committed[6].contributors, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(committed[6].stale_contributors, (std::vector<std::string>{"c"}));
  EXPECT_EQ(committed[6].tokens, 300u);
}

// A push for a round the window closed: late, folded into the next round, and told how long ago
// its round committed.
TEST_F(GrpcGraceTest, ALatePushLearnsHowFarBehindItIs) {
  for (uint64_t r = 0; r < 4; ++r) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kPeriodS));
    Round(r, {"a", "b", "c"});
    AwaitRound(r + 1);
  }
  auto c = IslandOf("c");
  const std::vector<float> theta4 = c->global();
  Round(4, {"a", "b"});
  AwaitRound(5);
  std::this_thread::sleep_for(std::chrono::duration<double>(2 * kPeriodS));
  std::vector<float> local = theta4;
  for (float& x : local) x -= 1.0f;
  auto late = c->SyncRound(local, 100);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_TRUE(late->late);
  EXPECT_GE(late->behind_s, 2 * kPeriodS);
  EXPECT_LT(late->behind_s, 60);
  EXPECT_EQ(c->round(), 5u);
  EXPECT_EQ(c->global_hash(), sync_->params_hash());
}

// The window learns from rounds of one length: after the warm start's one-step rounds the
// history starts again, and the first rounds of H steps wait for every member (the fixed
// deadline) instead of cutting a straggler by what one-step rounds taught.
class GrpcGracePhaseTest : public GrpcGraceTest {
 protected:
  outer::SyncServerOptions Options() const override {
    outer::SyncServerOptions o = GrpcGraceTest::Options();
    o.sync_every = 8;
    o.phases.warm_start_steps = 4;
    return o;
  }
};

TEST_F(GrpcGracePhaseTest, ANewPhaseOfTheScheduleWaitsUntilItHasAHistory) {
  for (uint64_t r = 0; r < 4; ++r) {  // the 4 warm-start rounds
    std::this_thread::sleep_for(std::chrono::duration<double>(kPeriodS));
    Round(r, {"a", "b", "c"});
    AwaitRound(r + 1);
  }
  // The first two rounds of H steps, c late in each: no window yet, c is waited for.
  for (uint64_t r = 4; r < 6; ++r) {
    Round(r, {"a", "b"});
    std::this_thread::sleep_for(std::chrono::duration<double>(6 * kPeriodS));
    EXPECT_EQ(sync_->round(), r);
    Round(r, {"c"});
    AwaitRound(r + 1);
    EXPECT_EQ(Committed()[r].contributors, (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_LT(Committed()[r].grace_s, 0);  // no window was opened
  }
}

// "off" waits for every member until the fixed deadline, as before.
class GrpcNoGraceTest : public GrpcGraceTest {
 protected:
  outer::SyncServerOptions Options() const override {
    outer::SyncServerOptions o = GrpcGraceTest::Options();
    o.grace = {outer::GraceSpec::Mode::kOff, 0};
    return o;
  }
};

TEST_F(GrpcNoGraceTest, WithoutAWindowTheRoundWaitsForEveryMember) {
  for (uint64_t r = 0; r < 5; ++r) {
    Round(r, {"a", "b", "c"});
    AwaitRound(r + 1);
  }
  Round(5, {"a", "b"});
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kPeriodS));
  EXPECT_EQ(sync_->round(), 5u);
  Round(5, {"c"});
  AwaitRound(6);
  EXPECT_LT(Committed()[4].grace_s, 0);
}

}  // namespace
}  // namespace atl
