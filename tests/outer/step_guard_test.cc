// outer.step_guard (outer/service/rounds_scoring.cc): a round whose outer step the loss probe finds
// well above the islands' plain average, or that leaves out an island the outer momentum carries,
// commits that average and restarts the outer momentum; other rounds take the optimizer's step,
// and every copy applies what the service committed.
#include <memory>
#include <thread>
#include <vector>

#include "outer/base/scoring.h"
#include "tests/outer/sync_server_fixture.h"

namespace atl::outer {
namespace {

// Held-out loss as a narrow valley in the parameters' mean: (1 + slope r) (1 + 10 (mean - 0.5)^2)
// on row r, plus the row's offset. With a slope, a contribution worse than the others is worse on
// every row by a different amount, so the scoring's t's are finite (15.6 at 8 rows and a slope of
// 0.1; harmful: below -12).
class ValleyProbe : public LossProbe {
 public:
  explicit ValleyProbe(double slope = 0) : slope_(slope) {}
  absl::StatusOr<std::vector<double>> Losses(uint32_t, const float* params, uint64_t n) override {
    double sum = 0;
    for (uint64_t i = 0; i < n; ++i) sum += params[i];
    const double off = sum / double(n) - 0.5;
    std::vector<double> rows(8);
    for (size_t r = 0; r < rows.size(); ++r) {
      rows[r] = (1 + slope_ * double(r)) * (1 + 10 * off * off) + 0.001 * double(r);
    }
    return rows;
  }
  void Set(uint32_t, const float*, uint64_t) override {}

 private:
  double slope_;
};

class StepGuardTest : public SyncServerTest {
 protected:
  // Nesterov 0.7 / 0.9 over 4 parameters at 1, `probe` (a flat valley) on; islands a, b, c joined.
  std::unique_ptr<SyncServer> Start(
      double guard, std::shared_ptr<LossProbe> probe = std::make_shared<ValleyProbe>()) {
    options_.optimizer = {0.7, 0.9, true};
    options_.scoring.loss_probe = true;
    options_.scoring.step_guard = guard;
    options_.loss_probe = std::move(probe);
    auto s = Make({1, 1, 1, 1});
    for (const char* name : {"a", "b", "c"}) {
      Join(*s, name);
      transports_.push_back(std::make_unique<InProcessTransport>(s.get()));
      islands_.push_back(std::make_unique<IslandSync>(transports_.back().get(), "run", Id(name), 4,
                                                      IslandSyncOptions()));
      EXPECT_TRUE(islands_.back()->FetchGlobal().ok());
    }
    return s;
  }
  // One round in which every island trains to its global parameters minus `delta`.
  std::shared_ptr<const CommittedRound> Round(SyncServer& s, uint64_t round, float delta) {
    return Round(s, round, std::vector<float>(islands_.size(), delta));
  }
  // ... island i to its global parameters minus deltas[i].
  std::shared_ptr<const CommittedRound> Round(SyncServer& s, uint64_t round,
                                              const std::vector<float>& deltas) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < islands_.size(); ++i) {
      threads.emplace_back([island = islands_[i].get(), delta = deltas[i]] {
        std::vector<float> local = island->global();
        for (float& x : local) x -= delta;
        EXPECT_TRUE(island->SyncRound(local, 100).ok());
      });
    }
    for (auto& t : threads) t.join();
    auto committed = s.AwaitRound(round, absl::Now() + absl::Seconds(10), 0);
    EXPECT_TRUE(committed.ok()) << committed.status();
    return committed.ok() ? *committed : nullptr;
  }
  void ExpectCopiesIdentical(const SyncServer& s) {
    for (auto& island : islands_) EXPECT_EQ(island->global(), s.params());
  }

  std::vector<std::unique_ptr<InProcessTransport>> transports_;
  std::vector<std::unique_ptr<IslandSync>> islands_;
};

TEST_F(StepGuardTest, AStepPastTheIslandsAverageCommitsTheAverageAndRestartsTheMomentum) {
  auto s = Start(0.1);
  // Round 0: the islands at 0.9; Nesterov's step, 0.7 (0.1 + 0.9 x 0.1) = 0.133, lands nearer the
  // valley's floor than they do: taken.
  auto r0 = Round(*s, 0, 0.1f);
  ASSERT_NE(r0, nullptr);
  EXPECT_FALSE(r0->aggregation.scores.step_guarded);
  EXPECT_LT(r0->aggregation.scores.step_loss, r0->aggregation.scores.average_loss);
  const float p1 = s->params()[0];
  EXPECT_NEAR(p1, 0.867f, 1e-6);
  // Round 1: the islands land on the floor (0.5); the step (m = 0.09 + 0.367) would go 0.178 past
  // it, loss 1.32 against 1.00: the round commits the islands' average.
  auto r1 = Round(*s, 1, p1 - 0.5f);
  ASSERT_NE(r1, nullptr);
  EXPECT_TRUE(r1->aggregation.scores.step_guarded);
  EXPECT_NEAR(r1->aggregation.scores.step_loss, 1.3197, 1e-3);
  EXPECT_NEAR(r1->aggregation.scores.average_loss, 1.0035, 1e-6);
  EXPECT_EQ(s->params()[0], p1 - (p1 - 0.5f));
  ExpectCopiesIdentical(*s);
  // Round 2: a step from a restarted momentum, 0.7 x 1.9 x 0.1 = 0.133 (the old momentum would
  // have made it 0.190), and not guarded (1.18 against 1.10).
  auto r2 = Round(*s, 2, 0.1f);
  ASSERT_NE(r2, nullptr);
  EXPECT_FALSE(r2->aggregation.scores.step_guarded);
  EXPECT_NEAR(s->params()[0], 0.5f - 0.133f, 1e-6);
  ExpectCopiesIdentical(*s);
}

TEST_F(StepGuardTest, LeavingOutAnIslandTheMomentumCarriesCommitsTheAverageAndRestartsIt) {
  auto s = Start(0.1, std::make_shared<ValleyProbe>(0.1));
  auto r0 = Round(*s, 0, 0.1f);
  ASSERT_NE(r0, nullptr);
  EXPECT_FALSE(r0->aggregation.scores.step_guarded);
  const float p1 = s->params()[0];
  EXPECT_NEAR(p1, 0.867f, 1e-6);
  // Round 1: c pushes away from the floor and is left out as harmful. Its round-0 contribution is
  // in the momentum, so the round commits a and b's average (0.1) from a restarted momentum,
  // although the step itself (to 0.677) would land nearer the floor than the average (0.767).
  auto r1 = Round(*s, 1, {0.1f, 0.1f, -0.3f});
  ASSERT_NE(r1, nullptr);
  ASSERT_TRUE(r1->aggregation.scores.islands.count("c"));
  EXPECT_TRUE(r1->aggregation.scores.islands.at("c").harmful);
  EXPECT_EQ(r1->contributors, (std::vector<std::string>{"a", "b"}));
  EXPECT_LT(r1->aggregation.scores.step_loss, r1->aggregation.scores.average_loss);
  EXPECT_TRUE(r1->aggregation.scores.step_guarded);
  EXPECT_NEAR(s->params()[0], p1 - 0.1f, 1e-6);
  ExpectCopiesIdentical(*s);
  // Round 2: c left out again, but the last commit did not fold it in: the optimizer's step from
  // the restarted momentum, 0.7 x 1.9 x 0.1 = 0.133.
  auto r2 = Round(*s, 2, {0.1f, 0.1f, -0.3f});
  ASSERT_NE(r2, nullptr);
  EXPECT_TRUE(r2->aggregation.scores.islands.at("c").excluded);
  EXPECT_FALSE(r2->aggregation.scores.step_guarded);
  EXPECT_NEAR(s->params()[0], p1 - 0.1f - 0.133f, 1e-6);
  ExpectCopiesIdentical(*s);
}

TEST_F(StepGuardTest, OffTheOptimizersStepIsTakenWhereverItLands) {
  auto s = Start(0);
  Round(*s, 0, 0.1f);
  const float p1 = s->params()[0];
  auto r1 = Round(*s, 1, p1 - 0.5f);
  ASSERT_NE(r1, nullptr);
  EXPECT_FALSE(r1->aggregation.scores.step_guarded);
  EXPECT_EQ(r1->aggregation.scores.step_loss, 0);  // not probed
  EXPECT_NEAR(s->params()[0], p1 - 0.7f * (0.367f + 0.9f * (0.09f + 0.367f)), 1e-5);
  ExpectCopiesIdentical(*s);
}

}  // namespace
}  // namespace atl::outer
