// Moment averaging (outer.moment_sync_every; outer/service/moment_desk.h and
// outer/island/island_sync_moments.cc): islands' moments in, their bf16 average out, the same on
// every rank and for a joiner; and what the service refuses, leaving its sums as they were.
#include <cstring>
#include <optional>

#include "outer/island/moment_sync.h"
#include "outer/island/outer_step.h"
#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

// bf16 by round-to-nearest-even, written out here (the reference the codec is checked against).
float Bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

// An island's made-up moments of the whole 1000-element fragment, channel-major: channel 0 of
// either sign, channel 1 never negative.
std::vector<float> MadeUpMoments(float scale) {
  std::vector<float> m(2 * 1000);
  for (size_t i = 0; i < 1000; ++i) {
    m[i] = scale * std::sin(0.37f * float(i) + scale);
    m[1000 + i] = scale * scale * (1.5f + std::cos(0.11f * float(i)));
  }
  return m;
}

// A rank's part of whole-fragment moments: its ranges of each channel, channel-major.
std::vector<float> PartOf(const std::vector<float>& whole,
                          const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::vector<float> out;
  for (uint64_t c = 0; c < 2; ++c) {
    for (const auto& [b, e] : ranges) {
      out.insert(out.end(), whole.begin() + int64_t(c * 1000 + b),
                 whole.begin() + int64_t(c * 1000 + e));
    }
  }
  return out;
}

// The moments push of `island` for `round`, elements [offset, offset + n) of the 2000 of the
// layout, as one chunk.
std::vector<pb::PushRequest> MomentPush(const std::string& island, const std::string& session,
                                        uint64_t round, const std::vector<float>& values,
                                        uint64_t offset, const std::string& optimizer = "adamw") {
  auto chunks = *EncodeChunks({"run", island, round, 0}, kMomentCodec, values.data(), offset,
                              values.size(), 2000, size_t(1) << 20);
  std::vector<pb::PushRequest> out(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) *out[i].mutable_chunk() = chunks[i];
  out[0].set_session(session);
  out[0].set_moments(optimizer);
  return out;
}

class MomentsTest : public SyncServerTest {};

TEST_F(MomentsTest, EveryRankLoadsTheBf16AverageAndAJoinerTheNewest) {
  const std::vector<float> init = TwoIslandsOf1000();
  options_.moment_sync_every = 2;
  auto s = Make(init);
  InProcessTransport transport(s.get());
  auto t = JoinThreeRanks(*s, &transport, 0.0, {});
  // Round 0 is not a moment round (every 2: rounds 1, 3, ...).
  ASSERT_TRUE(SyncThree(t, 0).ok());
  EXPECT_EQ(s->moments_round(), -1);

  const std::vector<float> ma = MadeUpMoments(0.5f), mb = MadeUpMoments(-0.25f);
  ASSERT_EQ(t.a->round(), 1u);
  ASSERT_TRUE(t.a->PushMoments("adamw", ma, 1, 8).ok());
  ASSERT_TRUE(t.b0->PushMoments("adamw", PartOf(mb, kRank0Ranges), 1, 8).ok());
  ASSERT_TRUE(t.b1->PushMoments("adamw", PartOf(mb, kRank1Ranges), 1, 8).ok());
  // Not before the round has committed: its moments may still come.
  EXPECT_TRUE(absl::IsFailedPrecondition(t.a->FetchMoments("adamw", 1, nullptr).status()));
  ASSERT_TRUE(SyncThree(t, 1).ok());

  std::vector<float> expected(2000);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = Bf16((Bf16(ma[i]) + Bf16(mb[i])) / 2);
  uint64_t bytes = 0;
  auto a = t.a->FetchMoments("adamw", 1, &bytes);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, expected);
  EXPECT_GE(bytes, 2000u * 2);
  auto b0 = t.b0->FetchMoments("adamw", 1, nullptr);
  auto b1 = t.b1->FetchMoments("adamw", 1, nullptr);
  ASSERT_TRUE(b0.ok() && b1.ok());
  EXPECT_EQ(*b0, PartOf(expected, kRank0Ranges));
  EXPECT_EQ(*b1, PartOf(expected, kRank1Ranges));
  EXPECT_EQ(s->moments_round(), 1);

  // A joiner asks for the newest (here a fresh IslandSync of a); another optimizer's are refused.
  IslandSync c(&transport, "run", Id("a"), 1000, {});
  auto newest = c.FetchMoments("adamw", 0, nullptr);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, expected);
  EXPECT_TRUE(absl::IsFailedPrecondition(c.FetchMoments("muon", 0, nullptr).status()));
}

TEST_F(MomentsTest, RefusedPushesLeaveTheSumAsItWas) {
  TwoIslandsOf1000();
  options_.moment_sync_every = 2;
  auto s = Make(Sines(1000));
  Join(*s, "a");
  Join(*s, "b");
  const std::vector<float> ma = MadeUpMoments(0.5f);
  const std::string sa = sessions_["a"], sb = sessions_["b"];
  // Before any: none to fetch.
  auto none = s->FetchState(Fetch("a"), [](pb::StateChunk&&) { return true; });
  EXPECT_TRUE(none.ok());  // the parameters, as before
  auto fetch = Fetch("a");
  fetch.set_moments("adamw");
  EXPECT_TRUE(absl::IsNotFound(s->FetchState(fetch, [](pb::StateChunk&&) { return true; })));

  auto refused = [&](std::vector<pb::PushRequest> push, absl::StatusCode code,
                     const std::string& says) {
    auto r = s->Push(push);
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(says));
  };
  // Round 0 is not a moment round; round 1 is still to come (the open round is 0).
  refused(MomentPush("a", sa, 0, ma, 0), absl::StatusCode::kFailedPrecondition,
          "not a moment round");
  refused(MomentPush("a", sa, 1, ma, 0), absl::StatusCode::kFailedPrecondition, "in the future");
  // Pushes of the open round's pseudo-gradients move it on; round 1 is then open.
  ASSERT_TRUE(s->Push(Payload("a", 0, std::vector<float>(1000, 0.01f))).ok());
  ASSERT_TRUE(s->Push(Payload("b", 0, std::vector<float>(1000, 0.02f))).ok());
  ASSERT_EQ(s->round(), 1u);
  // A NaN the codec would not make: its bf16 bits written into the chunk, checksummed anew.
  auto nan = MomentPush("a", sa, 1, ma, 0);
  auto* data = nan[0].mutable_chunk()->mutable_data();
  (*data)[2 * 17] = char(0xC0);
  (*data)[2 * 17 + 1] = char(0x7F);
  nan[0].mutable_chunk()->set_xxh64(compression::Checksum(data->data(), data->size()));
  refused(nan, absl::StatusCode::kInvalidArgument, "element 17");
  std::vector<float> bad = ma;
  bad[1500] = -1.0f;
  refused(MomentPush("a", sa, 1, bad, 0), absl::StatusCode::kInvalidArgument, "never negative");
  refused(MomentPush("a", sa, 1, ma, 0, "sgd"), absl::StatusCode::kInvalidArgument,
          "unknown optimizer");
  refused(MomentPush("a", sb, 1, ma, 0), absl::StatusCode::kUnauthenticated, "");
  // a gives all of it; again, or any part of it again, is refused; b's Muon moments too.
  ASSERT_TRUE(s->Push(MomentPush("a", sa, 1, ma, 0)).ok());
  refused(MomentPush("a", sa, 1, std::vector<float>(ma.begin() + 1000, ma.end()), 1000),
          absl::StatusCode::kAlreadyExists, "already");
  refused(MomentPush("b", sb, 1, ma, 0, "muon"), absl::StatusCode::kFailedPrecondition,
          "gathers adamw's");
  // b gives channel 0 alone: channel 1 is a's alone.
  const std::vector<float> b0(1000, 0.25f);
  ASSERT_TRUE(s->Push(MomentPush("b", sb, 1, b0, 0)).ok());
  ASSERT_TRUE(s->Push(Payload("a", 1, std::vector<float>(1000, 0.01f))).ok());
  ASSERT_TRUE(s->Push(Payload("b", 1, std::vector<float>(1000, 0.02f))).ok());
  ASSERT_EQ(s->round(), 2u);

  fetch.set_moments_round(1);
  std::vector<float> got(2000);
  std::optional<Assembler> assembler;
  ASSERT_TRUE(s->FetchState(fetch, [&](pb::StateChunk&& c) {
                 if (!assembler) {
                   assembler.emplace(PayloadId{"run", "", 1, 0}, 2000, 0, 2000, kMomentCodec,
                                     [&](uint64_t first, const float* v, uint64_t k) {
                                       std::copy(v, v + k, got.data() + first);
                                     });
                 }
                 return assembler->Add(c.chunk()).ok();
               }).ok());
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(got[i], Bf16((Bf16(ma[i]) + 0.25f) / 2)) << i;
    ASSERT_EQ(got[1000 + i], Bf16(ma[1000 + i])) << i;
  }
  // Late for an averaged round.
  refused(MomentPush("b", sb, 1, std::vector<float>(ma.begin() + 1000, ma.end()), 1000),
          absl::StatusCode::kFailedPrecondition, "averaged already");
}

TEST_F(MomentsTest, ARunWithoutMomentAveragingRefusesThem) {
  auto s = Make();
  Join(*s, "a");
  auto r = s->Push(MomentPush("a", sessions_["a"], 1, std::vector<float>(8, 1.0f), 0));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("outer.moment_sync_every"));
}

// An island model holding moments of 4 elements, as a test sets them.
class MomentModel : public IslandModel {
 public:
  int64_t step() const override { return 100; }
  std::vector<float> Snapshot(uint32_t) override { return {}; }
  void Merge(uint32_t, const std::vector<float>&, double) override {}
  void JumpToStep(int64_t) override {}
  void FollowRunProgress(int64_t) override {}
  std::string moment_optimizer() const override { return "adamw"; }
  std::vector<float> MomentSnapshot(uint32_t) override { return moments; }
  void LoadMoments(uint32_t, const std::vector<float>& m) override { moments = m; }
  std::vector<float> moments;
};

// An average no larger than kMomentBound times the island's own moments (in each channel) is
// loaded; a larger one, which only a hostile push can make, is not, and the island says so; a
// fresh optimizer (zeros) takes any.
TEST(MomentGuardTest, AnInflatedAverageIsNotLoaded) {
  MomentModel model;
  std::vector<std::string> said;
  auto say = [&](const std::string& line) { said.push_back(line); };
  RoundOutcome landed;
  landed.round = 3;
  model.moments = {1, -1, 1, -1, 0.5f, 0.5f, 0.5f, 0.5f};
  landed.moments = {3, -3, 3, -3, 1, 1, 1, 1};  // 3x and 2x
  EXPECT_TRUE(LoadLandedMoments(model, 0, landed, say));
  EXPECT_EQ(model.moments, landed.moments);
  const std::vector<float> own = model.moments;
  landed.moments = {3, -3, 3, -3, 100, 1, 1, 1};  // channel 1: 50x
  EXPECT_FALSE(LoadLandedMoments(model, 0, landed, say));
  EXPECT_EQ(model.moments, own);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_THAT(said[0], HasSubstr("channel 1 norm is"));
  model.moments.assign(8, 0.0f);
  EXPECT_TRUE(LoadLandedMoments(model, 0, landed, say));
  EXPECT_EQ(model.moments, landed.moments);
  // Past the bounds the service keeps (a first moment of 1e30 would step ~1e33 x lr): refused by
  // an island with moments and by a fresh one alike.
  landed.moments = {1e30f, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<float> kept = model.moments;
  EXPECT_FALSE(LoadLandedMoments(model, 0, landed, say));
  model.moments.assign(8, 0.0f);
  EXPECT_FALSE(LoadLandedMoments(model, 0, landed, say));
  EXPECT_EQ(model.moments, std::vector<float>(8, 0.0f));
  ASSERT_EQ(said.size(), 3u);
  EXPECT_THAT(said[2], HasSubstr("element 0 (channel 0, parameter 0) is 1e+30 (at most 1e+06"));
}

// The bounds of a moment's value (kMomentMaxAbs) as the service checks them: two islands pushing
// bf16's largest finite value, whose sum would overflow, are refused by name, and the average
// is of what was taken. Only the newest moment round gathers: an older one's moments, pushed
// late, would become the "newest" average.
TEST_F(MomentsTest, MomentsPastTheirBoundOrOfAnOldRoundAreRefused) {
  TwoIslandsOf1000();
  options_.moment_sync_every = 2;
  auto s = Make(Sines(1000));
  Join(*s, "a");
  Join(*s, "b");
  const std::string sa = sessions_["a"], sb = sessions_["b"];
  ASSERT_TRUE(s->Push(Payload("a", 0, std::vector<float>(1000, 0.01f))).ok());
  ASSERT_TRUE(s->Push(Payload("b", 0, std::vector<float>(1000, 0.02f))).ok());
  std::vector<float> huge = MadeUpMoments(0.5f);
  huge[3] = 3.3895314e38f;      // bf16's largest finite value
  huge[1003] = 3.3895314e38f;
  for (const auto& [island, session] : {std::pair{"a", sa}, std::pair{"b", sb}}) {
    auto r = s->Push(MomentPush(island, session, 1, huge, 0));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("element 3 (channel 0, parameter 3) is 3.38953e+38 (at most 1e+06"));
  }
  EXPECT_EQ(s->moments_round(0), -1);
  // Rounds 1-3 pass without moments; round 4 is open, and round 3 the newest moment round.
  for (uint64_t r = 1; r < 4; ++r) {
    ASSERT_TRUE(s->Push(Payload("a", r, std::vector<float>(1000, 0.01f))).ok());
    ASSERT_TRUE(s->Push(Payload("b", r, std::vector<float>(1000, 0.02f))).ok());
  }
  ASSERT_EQ(s->round(), 4u);
  auto old = s->Push(MomentPush("a", sa, 1, MadeUpMoments(0.5f), 0));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition) << old.status();
  EXPECT_THAT(std::string(old.status().message()),
              HasSubstr("round 1 of fragment 0 is too late: round 3 is the newest moment round"));
  EXPECT_TRUE(s->Push(MomentPush("a", sa, 3, MadeUpMoments(0.5f), 0)).ok());
}

}  // namespace
}  // namespace atl::outer
