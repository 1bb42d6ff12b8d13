// Streaming DiLoCo over the real trainer, in process (no network): fragments and overlap, eager
// updates, sparse payloads and their accumulator across a resume (on the host and the device path),
// early phases, auto-tune, async fragments, the loss guard, and robust aggregation against a
// faulty island. The device path of the outer round is in device_copy_test.cc.
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

// Every island ended on the service's parameters (its global hash) without a resync.
void ExpectEveryCopyIsTheServices(const std::vector<absl::StatusOr<IslandSummary>>& results,
                                  const outer::SyncServer& server) {
  const uint64_t hash = ServiceHash(server);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_hash, hash);
    EXPECT_EQ(r->resyncs, 0u);
  }
}

// Two islands, four fragments, tau = 2, FP4 with stochastic rounding: every fragment's copies
// stay bit-identical.
TEST(StreamingTest, FragmentsOverlapAndStayBitIdentical) {
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 20;
  c.outer.stochastic_rounding = true;
  auto server = *MakeSyncServer(c);
  ASSERT_EQ(server->num_fragments(), 4u);
  const auto results = RunIslands(c, *server, dir);
  // Fragment f syncs at its offsets (f * 2, + 8, ...) and once more at the end.
  for (uint32_t f = 0; f < 4; ++f) EXPECT_GE(server->round(f), 2u) << f;
  const uint64_t hash = ServiceHash(*server);
  const size_t all_size = [&] {
    size_t n = 0;
    for (uint32_t f = 0; f < 4; ++f) n += server->params(f).size();
    return n;
  }();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_hash, hash);
    EXPECT_EQ(r->resyncs, 0u);
    EXPECT_GT(r->peak_bytes_in_flight, 0u);
    // At most one fragment's FP4 payload is in flight at a time with these offsets and tau < H/P.
    EXPECT_LT(r->peak_bytes_in_flight, compression::EncodedBytes(
                                           *compression::ParseCodec("fp4_e2m1"), all_size));
  }
}

// Eager updates, one island, outer SGD of lr 1, each round in flight for tau = 2 of H = 5:
// the stand-in is the island's own parameters and each landing keeps the steps trained since the
// push, so the run is plain training (to rounding). The alpha merge loses those steps.
TEST(StreamingTest, EagerUpdatesWithOneIslandAndUnitSgdArePlainTraining) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(40000, 7));
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  c.outer.sync_every = 5;
  c.outer.fragment_sync_delay = 2;
  c.outer.optimizer = {1.0, 0.0, false};
  const auto plain = TrainPlainly(c, 20);
  auto run = [&](bool eager, const std::string& name) {
    auto e = c;
    e.outer.eager_updates = eager;
    const auto solo = RunSolo(e, dir.Join(name));
    EXPECT_TRUE(solo.summary.ok()) << solo.summary.status();
    return solo.params;
  };
  ExpectPlainTraining(c, run(true, "eager"), *plain);
  // Without them the same run is not plain training: the merges halve the steps in flight.
  const auto merged = run(false, "merged");
  const auto params = Flatten(inner::PlanOf(c.model), inner::NamedParameters(*plain->model()));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    diff += double(merged[i] - params[i]) * (merged[i] - params[i]);
    norm += double(params[i]) * params[i];
  }
  EXPECT_GT(std::sqrt(diff / norm), 1e-4);
}

// Two islands with eager updates: their stand-ins differ, their global copies never do.
TEST(StreamingTest, EagerUpdatesKeepEveryGlobalCopyBitIdentical) {
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 20;
  c.outer.eager_updates = true;
  auto server = *MakeSyncServer(c);
  const auto results = RunIslands(c, *server, dir);
  ExpectEveryCopyIsTheServices(results, *server);
  for (uint32_t f = 0; f < 4; ++f) EXPECT_GE(server->round(f), 2u) << f;
}

// SparseLoCo's settings through Streaming DiLoCo: every island's copy is the service's after
// every round (the round records' hashes), nothing resyncs, and each way a round moves a small
// fraction of a bit per parameter (indices, scales and headers included).
TEST(StreamingTest, SparseFragmentsStayBitIdenticalAtAFractionOfABitPerParameter) {
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 24;
  c.outer.codec = *compression::ParseCodec("int2");
  c.outer.topk_density = 0.02;
  c.outer.topk_chunk = 1024;
  c.outer.error_feedback = true;
  c.outer.error_feedback_decay = 0.95;
  c.outer.optimizer.name = "sgd";
  c.outer.optimizer.lr = 1.0;
  c.outer.optimizer.momentum = 0;
  ASSERT_TRUE(Validate(c).ok()) << Validate(c);
  auto server = *MakeSyncServer(c);
  const auto results = RunIslands(c, *server, dir);
  const uint64_t hash = ServiceHash(*server);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_hash, hash);
    EXPECT_EQ(r->resyncs, 0u);
    ASSERT_GT(r->elements_synced, 0u);
    const double up = 8.0 * double(r->bytes_sent) / double(r->elements_synced);
    const double down = 8.0 * double(r->bytes_received) / double(r->elements_synced);
    EXPECT_LT(up, 0.6);    // 2% of values at 2 bits + 8.6-bit indices, plus headers
    EXPECT_LT(down, 0.6);  // the other island's push, relayed (outer SGD is linear)
  }
  // Each island's round records: its fragment's hash after every merge equals the other's.
  std::map<std::pair<int, int>, std::string> seen;
  int compared = 0;
  for (const char* island : {"island0", "island1"}) {
    std::ifstream metrics(dir.Join(std::string(island) + "/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("round")) continue;
      const auto key = std::make_pair(j["fragment"].get<int>(), j["round"].get<int>());
      const std::string h = j["global_hash"].get<std::string>();
      if (seen.count(key)) {
        EXPECT_EQ(seen[key], h);
        ++compared;
      }
      seen[key] = h;
    }
  }
  EXPECT_GE(compared, 8);
}

// One island's sparse rounds over 500 parameters: int2 values, 3 of every 64 kept, SGD at lr 1,
// decayed error feedback.
struct SparseRun {
  outer::SyncServerOptions options;
  outer::FragmentLayout layout;
  std::vector<float> init = std::vector<float>(500);
  outer::IslandSyncOptions sync;
  SparseRun() {
    options.run_id = "run";
    options.optimizer = {1.0, 0.0, false};
    options.num_data_streams = 1;
    options.codec = *compression::MakeSpec(int(compression::Codec::kInt2), 64, 3);
    layout.names = {"w"};
    layout.numels = {500};
    for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(float(i));
    sync.codec = options.codec;
    sync.error_feedback = true;
    sync.error_feedback_decay = 0.9f;
  }
  static std::shared_ptr<outer::IslandIdentity> Join(outer::SyncServer& server) {
    pb::JoinRequest join;
    join.set_run_id("run");
    join.set_name("a");
    auto joined = server.Join(join);
    EXPECT_TRUE(joined.ok()) << joined.status();
    return std::make_shared<outer::IslandIdentity>(joined->island_id(), joined->session());
  }
};

// A resumed island's accumulator: the residual written into a checkpoint (by two ranks, read back
// merged) and restored into a fresh island process's sync equals the uninterrupted island's, and
// so does every round after it, bit for bit.
TEST(ErrorFeedbackTest, AResumedAccumulatorEqualsAnUninterruptedOne) {
  const SparseRun run;
  const auto& options = run.options;
  const auto& layout = run.layout;
  const auto& init = run.init;
  const auto& so = run.sync;
  // Local training: the same made-up steps whichever process takes them.
  auto round = [](outer::IslandSync& sync, int r) {
    std::vector<float> local = sync.global();
    for (size_t i = 0; i < local.size(); ++i) local[i] -= 0.01f * std::cos(float(i * (r + 2)));
    auto out = sync.SyncRound(local, 10);
    ASSERT_TRUE(out.ok()) << out.status();
  };
  auto start = SparseRun::Join;
  // Uninterrupted: 6 rounds.
  outer::SyncServer s1(options, layout, init);
  outer::InProcessTransport t1(&s1);
  outer::IslandSync a(&t1, "run", start(s1), 500, so);
  ASSERT_TRUE(a.FetchGlobal().ok());
  for (int r = 0; r < 6; ++r) round(a, r);
  // Interrupted after 3: the checkpoint holds the residual in two ranks' slices.
  outer::SyncServer s2(options, layout, init);
  outer::InProcessTransport t2(&s2);
  const auto id = start(s2);
  TempDir dir;
  {
    outer::IslandSync b(&t2, "run", id, 500, so);
    ASSERT_TRUE(b.FetchGlobal().ok());
    for (int r = 0; r < 3; ++r) round(b, r);
    const std::vector<float> residual = b.ResidualSnapshot();
    for (int rank = 0; rank < 2; ++rank) {
      outer::OuterStepHook::Residual part;
      part.fragment = 0;
      part.fragment_elements = 500;
      const uint64_t begin = rank == 0 ? 0 : 200, end = rank == 0 ? 200 : 500;
      part.ranges = {{begin, end}};
      part.values.assign(residual.begin() + int64_t(begin), residual.begin() + int64_t(end));
      inner::TrainerState state;
      state.step = 3;
      AppendResiduals({part}, state);
      ASSERT_TRUE(WriteCheckpointShard(dir.Join("ckpt"), rank, 2, state, {}).ok());
    }
  }
  auto ckpt = ReadCheckpoint(dir.Join("ckpt"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  outer::IslandSync c(&t2, "run", id, 500, so);
  ASSERT_TRUE(c.FetchGlobal().ok());
  std::vector<float> restored(500, 0.0f);
  for (const auto& r : ResidualsOf(ckpt->state)) {
    ASSERT_EQ(r.fragment, 0u);
    std::copy(r.values.begin(), r.values.end(), restored.begin() + int64_t(r.ranges[0].first));
  }
  ASSERT_TRUE(c.RestoreResidual(restored).ok());
  for (int r = 3; r < 6; ++r) round(c, r);
  EXPECT_TRUE(c.residual() == a.residual());
  EXPECT_TRUE(s2.params() == s1.params());
  EXPECT_EQ(c.global_hash(), a.global_hash());
}

// The same on the device path (the host engine over CPU tensors): the residual lives beside the
// parameters, a checkpoint takes its snapshot, and a fresh island restores it there; the rounds
// after it are the uninterrupted island's, bit for bit.
TEST(ErrorFeedbackTest, ADeviceResidualResumesBitForBit) {
  const SparseRun run;
  struct Island {
    at::Tensor params = torch::zeros({500});
    std::unique_ptr<TensorDeviceCopy> copy;
    std::unique_ptr<outer::IslandSync> sync;
  };
  auto make = [&](outer::InProcessTransport& t, std::shared_ptr<outer::IslandIdentity> id) {
    Island island;
    auto copy = TensorDeviceCopy::Create(
        [p = island.params] { return std::vector<at::Tensor>{p}; }, 500, at::kCPU);
    EXPECT_TRUE(copy.ok()) << copy.status();
    island.copy = *std::move(copy);
    island.sync = std::make_unique<outer::IslandSync>(&t, "run", id, 500, run.sync);
    island.sync->set_device_copy(island.copy.get());
    return island;
  };
  auto round = [&](Island& island, int r) {
    torch::NoGradGuard no_grad;
    island.params.copy_(island.copy->global());
    island.params.sub_(0.01 * torch::cos(torch::arange(500, torch::kFloat) * float(r + 2)));
    ASSERT_TRUE(island.copy->Capture(true, run.sync.error_feedback_decay).ok());
    auto out = island.sync->SyncRoundOnDevice(10);
    ASSERT_TRUE(out.ok()) << out.status();
  };
  outer::SyncServer s1(run.options, run.layout, run.init);
  outer::InProcessTransport t1(&s1);
  Island a = make(t1, SparseRun::Join(s1));
  ASSERT_TRUE(a.sync->FetchGlobal().ok());
  for (int r = 0; r < 6; ++r) round(a, r);
  outer::SyncServer s2(run.options, run.layout, run.init);
  outer::InProcessTransport t2(&s2);
  const auto id = SparseRun::Join(s2);
  std::vector<float> residual;
  {
    Island b = make(t2, id);
    ASSERT_TRUE(b.sync->FetchGlobal().ok());
    for (int r = 0; r < 3; ++r) round(b, r);
    residual = b.sync->ResidualSnapshot();
  }
  ASSERT_EQ(residual.size(), 500u);
  EXPECT_TRUE(std::any_of(residual.begin(), residual.end(), [](float v) { return v != 0; }));
  Island c = make(t2, id);
  ASSERT_TRUE(c.sync->FetchGlobal().ok());
  EXPECT_EQ(c.sync->RestoreResidual(std::vector<float>(3)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.sync->RestoreResidual(residual).ok());
  for (int r = 3; r < 6; ++r) round(c, r);
  EXPECT_TRUE(c.sync->ResidualSnapshot() == a.sync->ResidualSnapshot());
  EXPECT_TRUE(s2.params() == s1.params());
  EXPECT_EQ(c.sync->global_hash(), a.sync->global_hash());
}

// A warm start and an early H before Streaming DiLoCo's staggered fragments (tau 2, FP4): every
// fragment commits the rounds the schedule says and every copy ends bit-identical.
TEST(StreamingTest, EarlyPhasesThenFragmentsStayBitIdentical) {
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 24;
  c.outer.phases = {3, 2, 4};  // steps 1-3 averaged, then H = 2 until step 7, then H = 8
  auto server = *MakeSyncServer(c);
  const auto results = RunIslands(c, *server, dir);
  const outer::SyncSchedule schedule(c.outer.sync_every, c.outer.num_fragments, c.outer.phases);
  for (uint32_t f = 0; f < 4; ++f) {
    // The schedule's rounds, plus the run's last one where the fragment is not due at its end.
    const uint64_t due = schedule.RoundsUntil(int(f), c.train.steps);
    const auto last = schedule.DueAfter(c.train.steps);
    const bool due_at_end = std::find(last.begin(), last.end(), f) != last.end();
    EXPECT_EQ(server->round(f), due + (due_at_end ? 0 : 1)) << "fragment " << f;
  }
  ExpectEveryCopyIsTheServices(results, *server);
}

// outer.auto_tune behind a slow link (every call 40 ms late: the state fetch when an island joins
// measures a link on which a fragment's round trip takes about 80 ms, while a fragment is due every
// two inner steps of a few ms): the service chooses a tau > 0 from the islands' reports, every
// island adopts it after its first round, and the copies stay bit-identical.
TEST(StreamingTest, AutoTuneChoosesTauFromTheMeasuredLink) {
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 24;
  c.outer.fragment_sync_delay = 0;
  c.outer.codec = *compression::ParseCodec("fp32");  // a fragment's round trip then takes about two call delays
  c.outer.auto_tune = true;
  auto server = *MakeSyncServer(c);
  std::vector<std::string> events;
  std::mutex mu;
  server->SetEventListener([&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(line);
  });
  const auto results = RunIslands(c, *server, dir, {}, absl::Milliseconds(40));
  const uint64_t hash = ServiceHash(*server);
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.front(), ::testing::HasSubstr("auto-tune: tau = "));
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->global_hash, hash);
    EXPECT_GT(r->tau, 0) << events.front();
    EXPECT_LT(r->tau, c.outer.sync_every);
    EXPECT_GT(r->link_bps, 0);
  }
  // The islands' metrics name the tau of every merged round: 0 for the first (pushed before the
  // service had chosen), then the choices (which follow the measured step time as it settles).
  const std::string metrics = testing::ReadFile(dir.Join("island0/metrics.jsonl"));
  EXPECT_THAT(metrics, ::testing::HasSubstr("\"tau\":0"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex("\"tau\":[1-7],"));
}

// Async Streaming DiLoCo in process: 2 islands, 4 fragments, tau = 2, FP4, one island throttled:
// every island ends on the service's final parameters, fragment by fragment. Also with a warm
// start of 3 steps (its schedule: AsyncScheduleTest; its step: SyncServerTest).
TEST(StreamingTest, AsyncFragmentsEndBitIdentical) {
  const std::vector<std::pair<bool, int>> cases = {{false, 0}, {true, 0}, {false, 3}};
  for (const auto& [sparse, warm] : cases) {
    SCOPED_TRACE(sparse ? "sparse int2, 2% of 1024" : warm > 0 ? "fp4, warm start" : "fp4");
    TempDir dir;
    auto c = StreamingConfig(dir);
    c.train.steps = 16;
    c.outer.mode = outer::OuterMode::kAsync;
    c.outer.phases.warm_start_steps = warm;
    if (sparse) {
      c.outer.codec = *compression::ParseCodec("int2");
      c.outer.topk_density = 0.02;
      c.outer.topk_chunk = 1024;
      c.outer.error_feedback = true;
      c.outer.optimizer.name = "sgd";
    }
    auto server = *MakeSyncServer(c);
    const auto results = RunIslands(c, *server, dir, {1.0, 2.0});
    EXPECT_TRUE(server->budget_reached());
    for (const auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->global_hash, ServiceHash(*server));
      EXPECT_EQ(r->resyncs, 0u);
      EXPECT_FALSE(r->staleness.empty());
    }
  }
}

// The loss-spike guard, made hair-trigger: every flagged step reloads the global parameters and
// the run still ends with every copy bit-identical.
TEST(StreamingTest, SpikeGuardReloadsTheGlobalParametersAndTheRunGoesOn) {
  TempDir dir;
  auto c = StreamingConfig(dir);
  c.train.steps = 16;
  c.outer.spike_window = 4;
  c.outer.spike_factor = 1e-6;  // anything above the recent median is a "spike"
  c.optim.lr = 1e-9;            // a flat, noisy loss: about every other step is above the median
  auto server = *MakeSyncServer(c);
  const auto results = RunIslands(c, *server, dir);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->spikes, 0u);
    EXPECT_EQ(r->global_hash, ServiceHash(*server));
  }
}

// 20 steps, one fragment, tau 0: a push every 10 steps (and so batches of up to 10 steps' stats).
Config PushEveryTenSteps(const TempDir& dir) {
  auto c = StreamingConfig(dir);
  c.train.steps = 20;
  c.outer.sync_every = 10;
  c.outer.num_fragments = 1;
  c.outer.fragment_sync_delay = 0;
  return c;
}

// The steps' stats come over from the device in batches (at log steps, before each push): with a
// log step every step or none, the runs are the same bit for bit, and every step is in
// metrics.jsonl with the same loss and gradient norm.
TEST(StreamingTest, StatsTakenInBatchesChangeNothing) {
  TempDir dir;
  const auto c = PushEveryTenSteps(dir);
  auto run = [&](int64_t log_every) {
    auto d = c;
    d.train.log_every = log_every;
    auto server = *MakeSyncServer(d);
    TempDir runs;
    const auto results = RunIslands(d, *server, runs);
    std::vector<std::vector<std::pair<double, double>>> steps;  // (loss, grad_norm) per island
    for (int i = 0; i < d.outer.islands; ++i) {
      EXPECT_TRUE(results[size_t(i)].ok()) << results[size_t(i)].status();
      std::ifstream in(runs.Join("island" + std::to_string(i)) + "/metrics.jsonl");
      std::vector<std::pair<double, double>> mine;
      for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (!j.contains("loss") || j.contains("round")) continue;
        EXPECT_EQ(j["step"].get<int64_t>(), int64_t(mine.size()) + 1);
        mine.emplace_back(j["loss"].get<double>(), j["grad_norm"].get<double>());
      }
      EXPECT_EQ(mine.size(), 20u);
      steps.push_back(mine);
    }
    std::sort(steps.begin(), steps.end());  // which island joins first (takes stream 0) varies
    return std::make_pair(steps, ServiceHash(*server));
  };
  const auto every = run(1), batched = run(1000);
  EXPECT_EQ(every.first, batched.first);
  EXPECT_EQ(every.second, batched.second);
}

// With its stats taken in batches, every loss is still judged before the push that would carry
// its step: one island, a push every 10 steps, no log steps, a hair-trigger guard that flags a
// step in every batch. Each push then carries nothing (the island went back to the global
// parameters first: it claims no tokens, and the round leaves it out) and the service's
// parameters end as they began; with the guard off, they move. The second reload is of the same
// global parameters as the first: the island says it is stuck.
TEST(StreamingTest, ALossIsJudgedBeforeThePushThatWouldCarryIt) {
  TempDir dir;
  auto c = PushEveryTenSteps(dir);
  c.outer.islands = 1;
  c.train.log_every = 1000;
  c.optim.lr = 1e-9;  // a flat, noisy loss: about every other step is above the median
  c.outer.spike_window = 4;
  auto run = [&](double factor, std::vector<float>* before) {
    auto d = c;
    d.outer.spike_factor = factor;
    auto server = *MakeSyncServer(d);
    *before = server->params(0);
    TempDir runs;
    const auto results = RunIslands(d, *server, runs);
    EXPECT_TRUE(results[0].ok()) << results[0].status();
    EXPECT_EQ(results[0].ok() ? results[0]->stuck_reloads : 99, factor < 1 ? 1u : 0u);
    return std::make_pair(server->params(0), results[0].ok() ? results[0]->spikes : 0);
  };
  std::vector<float> start_guarded, start_free;
  const auto [guarded, spikes] = run(1e-6, &start_guarded);
  const auto [free, no_spikes] = run(1e9, &start_free);
  EXPECT_EQ(spikes, 2u);  // one a batch: the first spike drops the rest of its batch
  EXPECT_EQ(no_spikes, 0u);
  EXPECT_TRUE(guarded == start_guarded);
  EXPECT_FALSE(free == start_free);
}

// Robust aggregation: 4 islands, one of which pushes sign-flipped, tripled pseudo-gradients (valid
// on the wire, inside the norm bound). With the mean the run barely learns; trimmed mean and median
// stay within 2% of the clean run's validation loss. (At M = 4 both robust rules drop one value at
// each end per coordinate, so they coincide; rounds.jsonl names the faulty island as the outlier.)
TEST(RobustAggregationTest, TrimmedMeanAndMedianOutvoteAFaultyIsland) {
  TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 11));
  auto c = DiLoCoConfig(dir.Join("text.txt"));
  c.outer.islands = 4;
  // Every round waits for all four: on a loaded machine a round with a quorum of one could
  // commit before a starved island's push (outer.grace), and the runs would then differ in more
  // than the aggregation.
  c.outer.min_islands = 4;
  c.outer.sync_every = 5;
  c.train.steps = 100;
  c.train.eval_batches = 8;
  c.optim.lr = 1e-2;
  const float kScale = -3.0f;
  auto run = [&](const std::string& rule, float faulty_scale, const std::string& name) {
    auto cfg = c;
    EXPECT_TRUE(outer::ParseConfigValue(rule, &cfg.outer.aggregation).ok());
    auto server = *MakeSyncServer(cfg);
    std::vector<std::string> outliers;
    server->SetCommitListener([&](const outer::CommittedRound& r) {
      outliers.insert(outliers.end(), r.aggregation.outliers.begin(), r.aggregation.outliers.end());
    });
    std::vector<absl::StatusOr<IslandSummary>> results(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        outer::InProcessTransport direct(server.get());
        outer::Faults faults;
        if (i == 3) faults.scale_pushes = faulty_scale;
        outer::FaultyTransport transport(&direct, faults);
        IslandOptions o;
        o.name = "island" + std::to_string(i);
        o.run_dir = dir.Join(name + "-" + o.name);
        results[size_t(i)] = RunIsland(cfg, transport, o);
      });
      // Island i joins i-th and so reads data stream i: runs differ only in the aggregation.
      while (server->num_members() < size_t(i + 1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    for (auto& t : threads) t.join();
    double loss = 0;
    for (const auto& r : results) {
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok() && r->last_eval) loss = r->last_eval->loss;
    }
    size_t flagged = std::count(outliers.begin(), outliers.end(), "island3");
    return std::make_pair(loss, flagged);
  };
  const double clean = run("mean", 1.0f, "clean").first;
  const double mean = run("mean", kScale, "mean").first;
  const auto [trimmed, trimmed_flagged] = run("trimmed_mean", kScale, "trimmed");
  const auto [median, median_flagged] = run("median", kScale, "median");

  std::printf("val_loss clean %.4f, faulty island: mean %.4f, trimmed_mean %.4f, median %.4f; "
              "outlier named in %zu and %zu of 20 rounds\n",
              clean, mean, trimmed, median, trimmed_flagged, median_flagged);
  EXPECT_GT(mean, 1.02 * clean);
  EXPECT_LT(trimmed, 1.02 * clean);
  EXPECT_LT(median, 1.02 * clean);
  EXPECT_GE(trimmed_flagged, 15u);  // named as the outlier in most of the 20 rounds
  EXPECT_GE(median_flagged, 15u);
}

}  // namespace
}  // namespace atl
