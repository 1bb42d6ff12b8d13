#include "outer/base/fragments.h"
#include "outer/island/outer_step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <map>

namespace atl::outer {
namespace {

// Parameters as a model's plan groups them (inner::FragmentGroups): two embeddings with block 0,
// three parameters of each block, the final norm and the head with the last block.
struct Model {
  std::vector<std::string> names;
  std::vector<int> groups;
};
Model Gpt(int layers) {
  Model m;
  auto add = [&](const std::string& name, int group) {
    m.names.push_back(name);
    m.groups.push_back(group);
  };
  add("tok_emb.weight", 0);
  add("pos_emb.weight", 0);
  for (int l = 0; l < layers; ++l) {
    for (const char* p : {"ln1.weight", "attn.qkv.weight", "mlp.proj.bias"}) {
      add("blocks." + std::to_string(l) + "." + p, l);
    }
  }
  add("ln_f.weight", layers - 1);
  add("head.weight", layers - 1);
  return m;
}

TEST(FragmentsTest, StridedAndSequentialPlacement) {
  const Model m = Gpt(6);
  auto strided = PlanFragments(m.groups, 3, FragmentPattern::kStrided);
  auto sequential = PlanFragments(m.groups, 3, FragmentPattern::kSequential);
  ASSERT_TRUE(strided.ok() && sequential.ok());
  auto frag = [&](const FragmentPlan& p, const std::string& name) {
    return p.fragment_of[size_t(std::find(m.names.begin(), m.names.end(), name) - m.names.begin())];
  };
  EXPECT_EQ(frag(*strided, "blocks.4.attn.qkv.weight"), 1u);  // 4 mod 3
  EXPECT_EQ(frag(*sequential, "blocks.4.attn.qkv.weight"), 2u);  // 4 * 3 / 6
  EXPECT_EQ(frag(*sequential, "blocks.1.ln1.weight"), 0u);
  // Embeddings with block 0, final norm and head with the last block.
  EXPECT_EQ(frag(*strided, "tok_emb.weight"), 0u);
  EXPECT_EQ(frag(*strided, "head.weight"), 2u);  // block 5 -> 5 mod 3
  EXPECT_EQ(frag(*sequential, "ln_f.weight"), 2u);
  // Every parameter in exactly one fragment, in model order.
  size_t total = 0;
  for (const auto& f : strided->parameters) {
    EXPECT_TRUE(std::is_sorted(f.begin(), f.end()));
    total += f.size();
  }
  EXPECT_EQ(total, m.names.size());
  // A model without blocks is one fragment.
  auto flat = PlanFragments({-1, -1}, 1, FragmentPattern::kStrided);
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->parameters[0].size(), 2u);
}

TEST(FragmentsTest, RefusesImpossiblePlans) {
  EXPECT_FALSE(PlanFragments(Gpt(2).groups, 3, FragmentPattern::kStrided).ok());
  EXPECT_FALSE(PlanFragments(Gpt(2).groups, 0, FragmentPattern::kStrided).ok());
  auto odd = Gpt(2).groups;
  odd.push_back(-2);
  EXPECT_FALSE(PlanFragments(odd, 1, FragmentPattern::kStrided).ok());
  EXPECT_FALSE(ParseFragmentPattern("random").ok());
}

TEST(SyncScheduleTest, EachFragmentOncePerHStepsAtStaggeredOffsets) {
  for (int h : {1, 7, 50, 100}) {
    for (int p : {1, 2, 3, 4}) {
      if (p > h) continue;
      SyncSchedule s(h, p);
      std::map<uint32_t, std::vector<int64_t>> when;
      for (int64_t t = 1; t <= 10 * h; ++t) {
        for (uint32_t f : s.DueAfter(t)) when[f].push_back(t);
      }
      ASSERT_EQ(when.size(), size_t(p)) << h << "/" << p;
      for (auto& [f, steps] : when) {
        // Exactly once in every window of H consecutive steps.
        for (size_t i = 1; i < steps.size(); ++i) EXPECT_EQ(steps[i] - steps[i - 1], h);
        EXPECT_GE(steps.size(), 9u);
        EXPECT_EQ(steps.front() % h, s.offset(int(f)) % h);
      }
      if (p > 1 && h >= p) {
        // Offsets spread evenly: no two fragments at the same step.
        for (int64_t t = 1; t <= 10 * h; ++t) EXPECT_LE(s.DueAfter(t).size(), 1u);
      }
    }
  }
  // P = 1 is plain DiLoCo: everything every H steps.
  SyncSchedule plain(50, 1);
  EXPECT_EQ(plain.DueAfter(50), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(plain.DueAfter(49).empty());
  EXPECT_TRUE(plain.DueAfter(0).empty());
  EXPECT_EQ(SyncSchedule(100, 4).offset(3), 75);
}

// Warm start and early H: every fragment together, then the staggered schedule from their end;
// DueStep, NextDue, RoundsUntil and RoundStart all tell the same schedule DueAfter does.
TEST(SyncScheduleTest, EarlyPhasesComeFirstAndEveryQueryAgrees) {
  // 3 one-step rounds, then H = 2 for 4 steps, then H = 8 with offsets 0 and 4.
  const SyncSchedule s(8, 2, SyncPhases{3, 2, 4});
  std::map<uint32_t, std::vector<int64_t>> when;
  for (int64_t t = 1; t <= 40; ++t) {
    for (uint32_t f : s.DueAfter(t)) when[f].push_back(t);
  }
  EXPECT_EQ(when[0], (std::vector<int64_t>{1, 2, 3, 5, 7, 15, 23, 31, 39}));
  EXPECT_EQ(when[1], (std::vector<int64_t>{1, 2, 3, 5, 7, 11, 19, 27, 35}));
  EXPECT_EQ(s.warm_start_rounds(), 3u);
  EXPECT_TRUE(s.WarmStartRound(2));
  EXPECT_FALSE(s.WarmStartRound(3));
  for (const SyncSchedule& x : {s, SyncSchedule(8, 2), SyncSchedule(10, 3, SyncPhases{5, 0, 0}),
                                SyncSchedule(6, 1, SyncPhases{0, 3, 9})}) {
    for (int f = 0; f < x.num_fragments(); ++f) {
      std::vector<int64_t> due;
      for (int64_t t = 1; t <= 60; ++t) {
        const auto d = x.DueAfter(t);
        if (std::find(d.begin(), d.end(), uint32_t(f)) != d.end()) due.push_back(t);
      }
      for (size_t r = 0; r < due.size(); ++r) {
        EXPECT_EQ(x.DueStep(f, r), due[r]) << "fragment " << f << " round " << r;
        EXPECT_EQ(x.RoundStart(f, r), r == 0 ? 0 : due[r - 1]);
      }
      for (int64_t t = 0; t < due.back(); ++t) {
        const int64_t next = *std::upper_bound(due.begin(), due.end(), t);
        EXPECT_EQ(x.NextDue(f, t), next) << "fragment " << f << " after " << t;
        EXPECT_EQ(x.RoundsUntil(f, t),
                  uint64_t(std::upper_bound(due.begin(), due.end(), t) - due.begin()));
      }
    }
  }
  // A rejoin in the early phase resumes at its round's start.
  EXPECT_EQ(s.ResumeStep({4, 4}), 5);
}

TEST(SyncScheduleTest, PhasesThatDoNotFitAreRefusedByName) {
  EXPECT_TRUE(Validate(SyncPhases{100, 5, 200}).ok());
  EXPECT_THAT(std::string(Validate(SyncPhases{-1, 0, 0}).message()),
              ::testing::HasSubstr("outer.warm_start_steps"));
  EXPECT_THAT(std::string(Validate(SyncPhases{0, 5, 0}).message()),
              ::testing::HasSubstr("needs outer.early_sync_steps"));
  EXPECT_TRUE(Validate(SyncPhases{0, 0, 300}).ok());  // off: the length is ignored
  EXPECT_THAT(std::string(Validate(SyncPhases{0, 5, 12}).message()),
              ::testing::HasSubstr("multiple of outer.early_sync_every"));
}

// Where a rejoining island resumes: the latest round start when every fragment's next push can be
// its open round; when the fragments disagree (a shard went back to its durable state) the
// earliest, so that no fragment skips a round.
TEST(SyncScheduleTest, ResumeStepLetsEveryFragmentPushItsOpenRoundNext) {
  const SyncSchedule one(10, 1);
  EXPECT_EQ(one.ResumeStep({3}), 30);
  EXPECT_EQ(one.ResumeStep({0}), 0);
  // H = 8, offsets 0, 2, 4, 6; after step 13 the open rounds are 1, 2, 2, 1.
  const SyncSchedule four(8, 4);
  EXPECT_EQ(four.DueStep(0, 1), 16);
  EXPECT_EQ(four.DueStep(3, 1), 14);
  const int64_t at = four.ResumeStep({1, 2, 2, 1});
  EXPECT_EQ(at, 12);
  for (uint32_t f = 0; f < 4; ++f) {
    const uint64_t open[] = {1, 2, 2, 1};
    int64_t next = at + 1;
    for (;; ++next) {
      const std::vector<uint32_t> due = four.DueAfter(next);
      if (std::find(due.begin(), due.end(), f) != due.end()) break;
    }
    EXPECT_EQ(next, four.DueStep(int(f), open[f])) << "fragment " << f;
  }
  // H = 10, offsets 0 and 5: fragment 0 went back a round (its shard lost round 1): resume where
  // fragment 1's round 2 starts (15), fragment 0 redoes its round 1 at 20.
  const SyncSchedule two(10, 2);
  EXPECT_EQ(two.ResumeStep({1, 2}), 15);
  EXPECT_EQ(two.ResumeStep({1, 1}), 10);
  // Fragment 1 went back instead: from its round's start (5) on, fragment 0 pushes once more.
  EXPECT_EQ(two.ResumeStep({2, 1}), 5);
}

// A module atoll does not build (from Python): contiguous runs of its parameters, balanced by
// elements, one group per fragment where the sizes allow it.
TEST(FragmentsTest, ContiguousGroupsBalanceElements) {
  EXPECT_EQ(ContiguousGroups({100, 1, 1, 100}, 2), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(ContiguousGroups({10, 10, 10, 10, 10, 10}, 3), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(ContiguousGroups({5, 5}, 1), (std::vector<int>{0, 0}));
  auto plan = PlanFragments(ContiguousGroups({100, 1, 1, 100}, 2), 2, FragmentPattern::kStrided);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->parameters, (std::vector<std::vector<size_t>>{{0, 1}, {2, 3}}));
  // One parameter holds nearly everything: fewer runs than fragments, refused by name.
  const auto groups = ContiguousGroups({1000, 1, 1}, 3);
  EXPECT_EQ(groups, (std::vector<int>{0, 1, 1}));
  EXPECT_THAT(PlanFragments(groups, 3, FragmentPattern::kSequential).status().message(),
              ::testing::HasSubstr("outer.num_fragments must be in [1, 2]"));
}

}  // namespace
// Async versions with a warm start of 3 steps (H = 8, 4 fragments at offsets 0, 2, 4, 6): after
// each of the island's first 3 steps every fragment is pushed, merged at once as a plain average;
// then each fragment's H counts from step 3 (fragment 0 at its full H).
TEST(AsyncScheduleTest, AWarmStartPushesEveryFragmentAfterEachOfItsSteps) {
  OuterStepOptions o;
  o.schedule.async = true;
  o.schedule.total_steps = 100;
  o.schedule.sync_every = 8;
  o.schedule.token_budget = 1000;
  o.schedule.phases.warm_start_steps = 3;
  o.island.tau = 2;
  auto policy = MakeRoundPolicy(o, 4);
  for (int64_t t = 1; t <= 3; ++t) {
    EXPECT_EQ(policy->DueAfter(t), (std::vector<uint32_t>{0, 1, 2, 3})) << "step " << t;
    EXPECT_TRUE(policy->WarmStartAfter(t));
    EXPECT_EQ(policy->DelayAfter(0, t), 0);
    for (uint32_t f = 0; f < 4; ++f) policy->Pushed(f, t);
  }
  EXPECT_FALSE(policy->WarmStartAfter(4));
  EXPECT_TRUE(policy->DueAfter(4).empty());
  EXPECT_EQ(policy->DueAfter(5), (std::vector<uint32_t>{1}));
  EXPECT_EQ(policy->DelayAfter(1, 5), 2);
  EXPECT_EQ(policy->DueAfter(11), (std::vector<uint32_t>{0, 1, 2, 3}));
  // Without a warm start nothing is due before the fragments' offsets.
  o.schedule.phases.warm_start_steps = 0;
  policy = MakeRoundPolicy(o, 4);
  EXPECT_FALSE(policy->WarmStartAfter(1));
  EXPECT_TRUE(policy->DueAfter(1).empty());
  EXPECT_EQ(policy->DueAfter(2), (std::vector<uint32_t>{1}));
}

}  // namespace atl::outer
