// The outer-sync service and the island's side of it, through the in-process transport.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "outer/aggregation.h"
#include "outer/faulty_transport.h"
#include "outer/in_process_transport.h"
#include "outer/island_sync.h"
#include "outer/outer_optimizer.h"
#include "outer/payload.h"
#include "outer/sync_server.h"
#include "tests/test_util.h"

namespace atl::outer {
namespace {

using ::testing::HasSubstr;

class SyncServerTest : public ::testing::Test {
 protected:
  SyncServerTest() {
    options_.run_id = "run";
    options_.optimizer = {1.0, 0.0, false};
    options_.num_data_streams = 3;
    layout_.names = {"w"};
    layout_.numels = {4};
  }
  std::unique_ptr<SyncServer> Make(std::vector<float> init = {1, 2, 3, 4}) {
    return std::make_unique<SyncServer>(options_, layout_, std::move(init));
  }
  // Joins and remembers the island's session credential, which every later call carries.
  std::string Join(SyncServer& s, const std::string& name) {
    pb::JoinRequest r;
    r.set_run_id("run");
    r.set_name(name);
    auto j = s.Join(r);
    EXPECT_TRUE(j.ok()) << j.status();
    if (!j.ok()) return "";
    sessions_[name] = j->session();
    return j->island_id();
  }
  // A fetch of a whole fragment 0 by `island`, with its credential.
  pb::FetchStateRequest Fetch(const std::string& island) {
    pb::FetchStateRequest fetch;
    fetch.set_run_id("run");
    fetch.set_island_id(island);
    fetch.set_session(sessions_[island]);
    return fetch;
  }
  // A service of one 1000-element fragment sent 64 elements per chunk; islands a and b joined.
  std::unique_ptr<SyncServer> ChunkedServiceOfTwo() {
    options_.num_data_streams = 2;
    options_.chunk_bytes = 256;
    layout_.numels = {1000};
    auto s = Make(std::vector<float>(1000, 1.0f));
    Join(*s, "a");
    Join(*s, "b");
    return s;
  }
  std::shared_ptr<const IslandIdentity> Id(const std::string& name) {
    return std::make_shared<IslandIdentity>(name, sessions_[name]);
  }
  std::vector<pb::PushRequest> Payload(const std::string& island, uint64_t round,
                                       std::vector<float> delta, uint64_t tokens = 10) {
    auto chunks = *EncodeChunks({"run", island, round, 0}, {compression::Codec::kFp32, 0},
                                delta.data(), 0, delta.size(), delta.size());
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(tokens);
    }
    out[0].set_session(sessions_[island]);
    return out;
  }
  // One sync round of two islands (in two threads), each with its own made-up local training.
  static std::pair<absl::StatusOr<RoundOutcome>, absl::StatusOr<RoundOutcome>> SyncBoth(
      IslandSync& a, IslandSync& b, int round) {
    std::vector<float> la = a.global(), lb = b.global();
    for (size_t i = 0; i < la.size(); ++i) {
      la[i] -= 0.01f * std::cos(float(i * (round + 1)));
      lb[i] += 0.003f * float(i % 7);
    }
    absl::StatusOr<RoundOutcome> ra;
    std::thread th([&] { ra = a.SyncRound(la, 100); });
    auto rb = b.SyncRound(lb, 50);
    th.join();
    return {std::move(ra), std::move(rb)};
  }
  // Two islands, Nesterov 0.7 / 0.9, one fragment of 1000 elements (returned: its initial values),
  // which a sharded island's two ranks split as kRank0Ranges and kRank1Ranges.
  std::vector<float> TwoIslandsOf1000() {
    options_.optimizer = {0.7, 0.9, true};
    options_.num_data_streams = 2;
    layout_.numels = {1000};
    return Sines(1000);
  }
  const std::vector<std::pair<uint64_t, uint64_t>> kRank0Ranges = {{0, 300}, {600, 800}},
                                                   kRank1Ranges = {{300, 600}, {800, 1000}};
  static std::vector<float> Sines(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(float(i));
    return v;
  }
  SyncServerOptions options_;
  FragmentLayout layout_;
  std::map<std::string, std::string> sessions_;
};

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
  // A push to the round being committed is refused at once.
  auto late = s->Push(Payload("a", 0, {1, 1, 1, 1}));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
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
      {Payload("a", 0, {1, 1, 1, 1}, 0), absl::StatusCode::kInvalidArgument, "at least 1 token"},
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
  auto stale = s->Push(Payload("a", 0, {1, 1, 1, 1}));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.status().message()), HasSubstr("already committed"));
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

TEST_F(SyncServerTest, IslandsStayBitIdenticalWithTheServiceWithEveryCodec) {
  options_.optimizer = {0.7, 0.9, true};
  options_.num_data_streams = 2;
  layout_.numels = {1000};
  const std::vector<float> init = Sines(1000);
  std::vector<compression::CodecSpec> specs;
  for (const char* name : {"fp32", "bf16", "int8", "fp4_e2m1", "fp4_e3m0", "int2"}) {
    specs.push_back(*compression::ParseCodec(name));
  }
  // Sparse: top-4 of 64 in int2, top-8 of 128 in fp4 (Nesterov makes the updates after the
  // first dense: they come back in dense FP4).
  specs.push_back(*compression::MakeSpec(int(compression::Codec::kInt2), 64, 4));
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
  const auto& r0 = kRank0Ranges;
  const auto& r1 = kRank1Ranges;
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
      // Calls dropped with probability `faults`, chunks corrupted with a quarter of it.
      FaultyTransport fa(&t0, {faults, absl::ZeroDuration(), faults / 4}),
          fb0(&t0, {faults, absl::ZeroDuration(), faults / 4, 0, 1, 2}),
          fb1(&t0, {faults, absl::ZeroDuration(), faults / 4, 0, 1, 3});
      Join(*s, "a");
      Join(*s, "b");
      IslandSyncOptions so;
      so.codec = options_.codec;
      so.chunk_bytes = 128;
      so.stochastic_rounding = true;
      so.seed = 7;
      so.error_feedback = error_feedback;
      so.fetch_piece_bytes = 1024;      // a state transfer of 4 pieces
      so.retries = 10;
      IslandSync a(&fa, "run", Id("a"), 1000, so);
      so.ranges = r0;
      IslandSync b0(&fb0, "run", Id("b"), 1000, so);
      so.ranges = r1;
      IslandSync b1(&fb1, "run", Id("b"), 1000, so);
      EXPECT_TRUE(a.FetchGlobal().ok() && b0.FetchGlobal().ok() && b1.FetchGlobal().ok());
      for (int round = 0; round < 4; ++round) {
        auto perturbed = [&](const IslandSync& x, float scale) {
          std::vector<float> v = x.global();
          for (size_t i = 0; i < v.size(); ++i) v[i] += scale * std::cos(float(i * (round + 1)));
          return v;
        };
        absl::StatusOr<RoundOutcome> ra, rb0, rb1;
        std::thread ta([&] { ra = a.SyncRound(perturbed(a, 0.01f), 100); });
        std::thread tb0([&] { rb0 = b0.SyncRound(perturbed(b0, -0.003f), 60); });
        rb1 = b1.SyncRound(perturbed(b1, -0.003f), 60);
        ta.join();
        tb0.join();
        EXPECT_TRUE(ra.ok() && rb0.ok() && rb1.ok()) << ra.status() << rb0.status() << rb1.status();
        if (!ra.ok() || !rb0.ok() || !rb1.ok()) return trace;
        EXPECT_EQ(a.global(), s->params());
        trace.params.push_back(s->params());
        trace.residuals.push_back(a.residual());
        trace.sent += ra->bytes_sent;
        trace.received += ra->bytes_received;
      }
      if (faults > 0) {
        EXPECT_GT(fa.dropped() + fb0.dropped() + fb1.dropped(), 0u);
        EXPECT_GT(fa.corrupted() + fb0.corrupted() + fb1.corrupted(), 0u);
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

// With the outer SGD the update's support is the union of the contributions': it comes back
// sparse (FP4 values), far smaller than dense FP4, and every copy stays the service's.
TEST_F(SyncServerTest, SparseContributionsComeBackAsTheirUnion) {
  options_.optimizer = {1.0, 0.0, false};
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
  auto r = b.SyncRound({0, 0, 0, 0}, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->resynced);
  EXPECT_THAT(r->resync_reason, HasSubstr("already committed"));
  EXPECT_EQ(b.global(), s->params());
  EXPECT_EQ(b.round(), 1u);
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
