#include "outer/service/membership.h"

#include "absl/strings/str_cat.h"
#include "outer/service/log_limiter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace atl::outer {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(MembershipTest, TransitionsFollowTheStateMachine) {
  using S = MemberState;
  EXPECT_TRUE(TransitionAllowed(S::kJoining, S::kActive));
  EXPECT_TRUE(TransitionAllowed(S::kJoining, S::kDead));
  EXPECT_TRUE(TransitionAllowed(S::kJoining, S::kLeaving));
  EXPECT_TRUE(TransitionAllowed(S::kActive, S::kLeaving));
  EXPECT_TRUE(TransitionAllowed(S::kActive, S::kDead));
  EXPECT_FALSE(TransitionAllowed(S::kActive, S::kJoining));
  EXPECT_FALSE(TransitionAllowed(S::kDead, S::kActive));
  EXPECT_FALSE(TransitionAllowed(S::kLeaving, S::kActive));
  EXPECT_FALSE(TransitionAllowed(S::kDead, S::kLeaving));
  EXPECT_STREQ(StateName(S::kJoining), "joining");
  EXPECT_STREQ(StateName(S::kDead), "dead");
}

TEST(MembershipTest, JoiningThenActiveAndLateJoinersAreWaitedForFromTheNextRound) {
  Membership m(3, absl::Seconds(5));
  auto a = m.Join("a", -1, {0, 0}, kT0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->state, MemberState::kJoining);
  EXPECT_EQ(a->required_from, (std::vector<uint64_t>{0, 0}));  // before the first commit
  ASSERT_TRUE(m.Contributed("a", kT0).ok());
  EXPECT_EQ(m.Find("a")->state, MemberState::kActive);
  // Joining while round 4 of fragment 0 and round 3 of fragment 1 are open.
  auto b = m.Join("b", -1, {4, 3}, kT0);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(Membership::Required(*b, 0, 4));
  EXPECT_TRUE(Membership::Required(*b, 0, 5));
  EXPECT_FALSE(Membership::Required(*b, 1, 3));
  EXPECT_TRUE(Membership::Required(*b, 1, 4));
  EXPECT_EQ(m.Join("a", -1, {4, 3}, kT0).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(m.epoch(), 2u);
}

TEST(MembershipTest, LeasesExpireIntoDeadAndTheNameRejoins) {
  Membership m(2, absl::Seconds(5));
  ASSERT_TRUE(m.Join("a", -1, {0}, kT0).ok());
  ASSERT_TRUE(m.Join("b", -1, {0}, kT0).ok());
  EXPECT_EQ(m.Join("c", -1, {0}, kT0).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(m.Heartbeat("a", kT0 + absl::Seconds(4)).ok());
  EXPECT_TRUE(m.ExpireLeases(kT0 + absl::Seconds(5)).empty());  // exactly the lease: alive
  EXPECT_EQ(m.ExpireLeases(kT0 + absl::Seconds(6)), (std::vector<std::string>{"b"}));
  EXPECT_EQ(m.size(), 1u);
  // The dead island is told why, and comes back on its own data stream.
  const auto s = m.Heartbeat("b", kT0 + absl::Seconds(7));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("declared dead after 5s of silence"));
  EXPECT_EQ(m.CheckMember("b").code(), absl::StatusCode::kPermissionDenied);
  auto back = m.Join("b", 1, {3}, kT0 + absl::Seconds(8));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data_stream, 1u);
  EXPECT_EQ(back->state, MemberState::kJoining);
  EXPECT_TRUE(m.CheckMember("b").ok());
}

TEST(MembershipTest, LeaveFreesTheStreamAndIsFinal) {
  Membership m(1, absl::Seconds(5));
  ASSERT_TRUE(m.Join("a", -1, {0}, kT0).ok());
  ASSERT_TRUE(m.Leave("a").ok());
  EXPECT_EQ(m.Leave("a").code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(m.CheckMember("a").message()), HasSubstr("it left"));
  EXPECT_EQ(m.Contributed("a", kT0).code(), absl::StatusCode::kPermissionDenied);
  auto c = m.Join("c", 0, {2}, kT0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data_stream, 0u);
}

TEST(MembershipTest, NamesAreCheckedAndNeverEchoedRaw) {
  Membership m(4, absl::Seconds(5));
  const std::string huge(15 << 20, 'x');
  for (const std::string& bad :
       {std::string(""), std::string("a\nround 99/30 committed"), std::string("nul\0x", 5),
        std::string("-dash"), std::string(65, 'a'), std::string("caf\xc3\xa9"), huge}) {
    auto r = m.Join(bad, -1, {0}, kT0);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(r.status().message());
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\0'), std::string::npos);
    EXPECT_LT(msg.size(), 400u);
  }
  EXPECT_EQ(m.size(), 0u);
  EXPECT_TRUE(m.Join(std::string(64, 'a'), -1, {0}, kT0).ok());
  EXPECT_TRUE(m.Join("dc1.rack-2_b", -1, {0}, kT0).ok());
  // A non-member's name in a refusal is escaped too.
  EXPECT_THAT(std::string(m.CheckMember("x\ny").message()), HasSubstr("'x\\ny'"));
}

TEST(MembershipTest, EachJoinGetsItsOwnSessionAndOnlyItAuthenticates) {
  Membership m(2, absl::Seconds(5));
  auto a = m.Join("a", -1, {0}, kT0);
  auto b = m.Join("b", -1, {0}, kT0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->session.size(), 32u);
  EXPECT_NE(a->session, b->session);
  EXPECT_TRUE(m.Authenticate("a", a->session).ok());
  EXPECT_EQ(m.Authenticate("a", b->session).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(m.Authenticate("a", "").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(m.Authenticate("zed", a->session).code(), absl::StatusCode::kPermissionDenied);
  // A rejoin makes the old credential worthless.
  ASSERT_TRUE(m.Leave("a").ok());
  auto again = m.Join("a", -1, {0}, kT0);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->session, a->session);
  EXPECT_EQ(m.Authenticate("a", a->session).code(), absl::StatusCode::kUnauthenticated);
}

TEST(MembershipTest, FormerMembersAreRememberedInBoundedSpace) {
  Membership m(1, absl::Seconds(5));
  const size_t cycles = Membership::kMaxDeparted + 600;
  for (size_t i = 0; i < cycles; ++i) {
    const std::string name = "island" + std::to_string(i);
    ASSERT_TRUE(m.Join(name, -1, {0}, kT0).ok());
    ASSERT_TRUE(m.Leave(name).ok());
  }
  EXPECT_EQ(m.departed(), Membership::kMaxDeparted);
  // The newest are still told why; the oldest have been forgotten.
  EXPECT_THAT(std::string(m.CheckMember("island" + std::to_string(cycles - 1)).message()),
              HasSubstr("it left"));
  EXPECT_THAT(std::string(m.CheckMember("island0").message()), HasSubstr("is not a member"));
  // Rejoining a remembered name forgets its end state (no double bookkeeping).
  ASSERT_TRUE(m.Join("island" + std::to_string(cycles - 1), -1, {0}, kT0).ok());
  EXPECT_EQ(m.departed(), Membership::kMaxDeparted - 1);
}

// Per key, then in total, then per window; what is held back is counted and reported once.
TEST(LogLimiterTest, BoundsLinesPerKeyAndInTotalAndReportsTheRest) {
  LogLimiter limiter({/*per_key=*/3, /*total=*/5, absl::Minutes(1), /*max_keys=*/4});
  int written = 0;
  for (int i = 0; i < 1000; ++i) written += limiter.Allow("island 'm' joined", kT0);
  EXPECT_EQ(written, 3);
  EXPECT_EQ(limiter.suppressed(), 997u);
  // Another key has its own 3, but the window's total is 5.
  for (int i = 0; i < 10; ++i) written += limiter.Allow("island 'n' left", kT0);
  EXPECT_EQ(written, 5);
  // Keys that arrive once the total is spent share one bucket: memory and reports stay bounded.
  for (int i = 0; i < 5000; ++i) {
    EXPECT_FALSE(limiter.Allow(absl::StrCat("island 'x", i, "' joined"), kT0));
  }
  EXPECT_TRUE(limiter.Flush(kT0 + absl::Seconds(30)).empty());  // no window has ended
  const auto lines = limiter.Flush(kT0 + absl::Minutes(1));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines, ::testing::Contains("island 'm' joined: 997 more such lines in the last 1m (not logged)"));
  EXPECT_THAT(lines, ::testing::Contains("island 'n' left: 8 more such lines in the last 1m (not logged)"));
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("(other keys): 5000 more")));
  // A new window writes again; an ended window without held lines reports nothing.
  EXPECT_TRUE(limiter.Allow("island 'm' joined", kT0 + absl::Minutes(2)));
  EXPECT_TRUE(limiter.Flush(kT0 + absl::Minutes(4)).empty());
}

}  // namespace
}  // namespace atl::outer
