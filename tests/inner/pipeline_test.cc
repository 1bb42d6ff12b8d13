// The pipeline's stage split and schedules, checked without a model: each schedule runs every
// micro-batch's forward before its backward, holds what it promises, and never deadlocks when
// sends do not block and receives do (the executor's rule).
#include "inner/parallel/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

namespace atl::inner::parallel {
namespace {

using A = PipelineAction;

TEST(PipelineTest, StagesTileTheUnitsWithTheSpareBlocksFirst) {
  EXPECT_EQ(PipelineStageUnits(3, 2, 0).first, 0);
  EXPECT_EQ(PipelineStageUnits(3, 2, 0).last, 2);  // embeddings, blocks 0 and 1
  EXPECT_EQ(PipelineStageUnits(3, 2, 1).first, 3);  // block 2, the head
  EXPECT_EQ(PipelineStageUnits(3, 2, 1).last, 4);
  for (int layers = 1; layers <= 9; ++layers) {
    for (int stages = 1; stages <= layers; ++stages) {
      int next = 0, most = 0, fewest = layers;
      for (int s = 0; s < stages; ++s) {
        const auto u = PipelineStageUnits(layers, stages, s);
        EXPECT_EQ(u.first, next) << layers << " layers, stage " << s << " of " << stages;
        const int blocks = std::min(u.last, layers) - std::max(u.first, 1) + 1;
        EXPECT_GE(blocks, 1);
        most = std::max(most, blocks);
        fewest = std::min(fewest, blocks);
        next = u.last + 1;
      }
      EXPECT_EQ(next, layers + 2);
      EXPECT_LE(most - fewest, 1);
    }
  }
  EXPECT_TRUE(ValidatePipeline(3, 3).ok());
  EXPECT_EQ(ValidatePipeline(3, 4).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PipelineTest, SchedulesInTheirOrder) {
  EXPECT_EQ(ScheduleActions(PipelineSchedule::kGPipe, 0, 2, 2),
            (std::vector<A>{{A::kForward, 0}, {A::kForward, 1}, {A::kBackward, 0},
                            {A::kBackward, 1}}));
  EXPECT_EQ(ScheduleActions(PipelineSchedule::k1F1B, 0, 2, 3),
            (std::vector<A>{{A::kForward, 0}, {A::kForward, 1}, {A::kBackward, 0},
                            {A::kForward, 2}, {A::kBackward, 1}, {A::kBackward, 2}}));
  EXPECT_EQ(ScheduleActions(PipelineSchedule::k1F1B, 1, 2, 2),
            (std::vector<A>{{A::kForward, 0}, {A::kBackward, 0}, {A::kForward, 1},
                            {A::kBackward, 1}}));
  EXPECT_DOUBLE_EQ(IdealBubble(2, 4), 0.2);
  EXPECT_DOUBLE_EQ(IdealBubble(1, 4), 0.0);
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  EXPECT_TRUE(ParseConfigValue("gpipe", &schedule).ok());  // any case
  EXPECT_EQ(schedule, PipelineSchedule::kGPipe);
  EXPECT_TRUE(ParseConfigValue("1F1B", &schedule).ok());
  EXPECT_EQ(schedule, PipelineSchedule::k1F1B);
  EXPECT_FALSE(ParseConfigValue("zero-bubble", &schedule).ok());
  EXPECT_EQ(ConfigValueText(PipelineSchedule::kGPipe), "GPipe");
}

// Runs every stage's actions as the executor does (a forward waits for the stage before, a
// backward for the stage after; sends never wait); false when no stage can move.
bool Completes(const std::vector<std::vector<A>>& stages) {
  const int p = int(stages.size());
  std::set<std::tuple<int, int, int>> sent;  // (kind, micro, stage)
  std::vector<size_t> at(size_t(p), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s) {
      if (at[size_t(s)] == stages[size_t(s)].size()) continue;
      const A& a = stages[size_t(s)][at[size_t(s)]];
      const int from = a.kind == A::kForward ? s - 1 : s + 1;
      if (from >= 0 && from < p && !sent.count({a.kind, a.micro, from})) continue;
      sent.insert({a.kind, a.micro, s});
      ++at[size_t(s)];
      moved = true;
    }
  }
  for (int s = 0; s < p; ++s) {
    if (at[size_t(s)] != stages[size_t(s)].size()) return false;
  }
  return true;
}

TEST(PipelineTest, SchedulesCompleteAndBoundWhatTheyHold) {
  for (auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        std::vector<std::vector<A>> all;
        for (int s = 0; s < p; ++s) {
          const auto actions = ScheduleActions(schedule, s, p, m);
          ASSERT_EQ(actions.size(), size_t(2 * m));
          std::set<int> forwarded;
          int held = 0, most = 0;
          for (const A& a : actions) {
            if (a.kind == A::kForward) {
              EXPECT_TRUE(forwarded.insert(a.micro).second);
              most = std::max(most, ++held);
            } else {
              EXPECT_TRUE(forwarded.count(a.micro)) << "backward before forward";
              --held;
            }
          }
          const int bound = schedule == PipelineSchedule::kGPipe ? m : std::min(m, p - s);
          EXPECT_EQ(most, bound) << PipelineScheduleName(schedule) << " stage " << s << "/" << p;
          all.push_back(actions);
        }
        EXPECT_TRUE(Completes(all)) << PipelineScheduleName(schedule) << " p " << p << " m " << m;
      }
    }
  }
  // The checker can fail: a stage that starts with its backward waits forever.
  EXPECT_FALSE(Completes({{{A::kBackward, 0}, {A::kForward, 0}}, {{A::kForward, 0}, {A::kBackward, 0}}}));
}

}  // namespace
}  // namespace atl::inner::parallel
