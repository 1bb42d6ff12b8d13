// DiLoCo equivalences, in process (no network): the outer loop around the real trainer against
// plain training, a reference loop and itself. Streaming DiLoCo and the rest: streaming_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "compression/checksum.h"
#include <nlohmann/json.hpp>
#include "compression/codec.h"
#include "outer/base/faulty_transport.h"
#include "outer/service/in_process_transport.h"
#include "outer/island/island_sync.h"
#include "src/service/coordinator.h"
#include "src/service/initial_state.h"
#include "src/store/flat_params.h"
#include "src/island/island_loop.h"
#include "src/island/island_report.h"
#include "src/store/checkpoint.h"
#include "src/island/tensor_device_copy.h"
#include "tests/src/island/diloco_util.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::atl::testing::TempDir;

// (a) M = 1, H = 1, outer SGD with lr 1 and no momentum is plain training (up to the rounding
// of theta - (theta - local)).
TEST(DiLoCoTest, OneIslandSyncEveryStepWithUnitSgdIsPlainTraining) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 7));
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  c.outer.sync_every = 1;
  c.outer.optimizer = {1.0, 0.0, false};
  const auto plain = TrainPlainly(c, 20);

  const auto run = RunSolo(c, dir.Join("island"));
  ASSERT_TRUE(run.summary.ok()) << run.summary.status();
  EXPECT_EQ(run.summary->rounds, 20u);
  ExpectPlainTraining(c, run.params, *plain);
}

TEST(DiLoCoTest, AnIslandWithAnotherModelIsRefused) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 7));
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  auto server = *MakeSyncServer(c);
  outer::InProcessTransport transport(server.get());
  auto other = c;
  other.model.d_model = 64;
  IslandOptions o;
  o.name = "odd";
  o.run_dir = dir.Join("odd");
  auto r = RunIsland(other, transport, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("[model] config differs"));
  EXPECT_EQ(server->num_members(), 0u);  // it left again
}

// Trains `islands` islands that all read the same data stream with the same seeds.
std::vector<float> TrainIdentical(const Config& c, int islands) {
  auto cfg = c;
  cfg.outer.islands = islands;
  auto server = *MakeSyncServer(cfg);
  auto data = inner::LoadDataset(cfg.data, cfg.model.context, cfg.model.vocab);
  EXPECT_TRUE(data.ok());
  std::vector<std::thread> threads;
  for (int i = 0; i < islands; ++i) {
    threads.emplace_back([&, i] {
      outer::InProcessTransport transport(server.get());
      pb::JoinRequest join;
      join.set_run_id(cfg.outer.run_id);
      join.set_name("island" + std::to_string(i));
      join.set_config_hash(ModelConfigHash(cfg.model));
      auto joined = transport.Join(join);
      ASSERT_TRUE(joined.ok());
      auto trainer = inner::Trainer::Create(cfg.trainer(), *data, 0, 1);
      ASSERT_TRUE(trainer.ok());
      const auto params = inner::NamedParameters(*(*trainer)->model());
      outer::IslandSync sync(
          &transport, cfg.outer.run_id,
          std::make_shared<outer::IslandIdentity>(joined->island_id(), joined->session()),
          LayoutOf(params).total());
      ASSERT_TRUE(sync.FetchGlobal().ok());
      LoadFlat(inner::PlanOf(cfg.model), sync.global(), params);
      while ((*trainer)->step() < cfg.train.steps) {
        ASSERT_TRUE(
            inner::RunLoop(**trainer, (*trainer)->step() + cfg.outer.sync_every, {}).ok());  // no parts
        auto r = sync.SyncRound(Flatten(inner::PlanOf(cfg.model), params), 100);
        ASSERT_TRUE(r.ok()) << r.status();
        LoadFlat(inner::PlanOf(cfg.model), sync.global(), params);
      }
    });
  }
  for (auto& t : threads) t.join();
  return server->params();
}

// (b) Two islands fed identical data and seeds produce the same global parameters as one.
TEST(DiLoCoTest, TwoIdenticalIslandsEqualOne) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 8));
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  c.train.steps = 15;
  c.outer.sync_every = 5;  // Nesterov, lr 0.7, momentum 0.9 (defaults)
  const auto one = TrainIdentical(c, 1);
  const auto two = TrainIdentical(c, 2);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_TRUE(one == two);
  // And the outer step did something: the result differs from plain local training.
  EXPECT_NE(one, TrainIdentical([&] { auto d = c; d.outer.sync_every = 15; return d; }(), 1));
}

// Streaming DiLoCo with P = 1, tau = 0, alpha = 0 and fp32 is plain DiLoCo, bit for bit: the
// island loop (RunIsland) against the reference loop above.
TEST(StreamingTest, OneFragmentNoDelayNoAlphaIsPlainDiLoCo) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 8));
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  c.train.steps = 15;
  c.outer.sync_every = 5;
  c.outer.num_fragments = 1;
  c.outer.fragment_sync_delay = 0;
  c.outer.fragment_update_alpha = 0;
  const auto reference = TrainIdentical(c, 1);
  const auto run = RunSolo(c, dir.Join("island"));
  ASSERT_TRUE(run.summary.ok()) << run.summary.status();
  EXPECT_TRUE(run.params == reference);
}

// A warm start is a plain average every step whatever the outer optimizer: a run that is all warm
// start equals H = 1 with outer SGD of lr 1 and no momentum, bit for bit.
TEST(DiLoCoTest, AWarmStartAveragesEveryStep) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 8));
  auto run = [&](const Config& c, const std::string& name) {
    const auto solo = RunSolo(c, dir.Join(name));
    EXPECT_TRUE(solo.summary.ok()) << solo.summary.status();
    if (solo.summary.ok()) {
      EXPECT_EQ(solo.summary->rounds, 10u);
    }
    return solo.params;
  };
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  c.train.steps = 10;
  auto plain = c;
  plain.outer.sync_every = 1;
  plain.outer.optimizer = {1.0, 0.0, false};
  auto warm = c;
  warm.outer.sync_every = 5;  // Nesterov, lr 0.7, momentum 0.9 (defaults) after the warm start
  warm.outer.phases.warm_start_steps = 10;
  EXPECT_TRUE(run(warm, "warm") == run(plain, "plain"));
}

}  // namespace
}  // namespace atl
