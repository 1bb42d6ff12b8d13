// A sharded outer-sync service, in process: a coordinator that keeps membership only, and shard
// servers that each hold some fragments and mirror the coordinator's membership. Islands reach the
// shards through a ShardRouter, exactly as over gRPC.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "outer/service/in_process_transport.h"
#include "outer/island/island_session.h"
#include "outer/island/island_sync.h"
#include "outer/island/shard_router.h"
#include "outer/service/sync_server.h"

namespace atl::outer {
namespace {

constexpr uint64_t kSizes[] = {300, 500, 200};  // three fragments

std::vector<FragmentLayout> Layouts() {
  std::vector<FragmentLayout> layouts;
  for (uint64_t n : kSizes) layouts.push_back({{absl::StrCat("w", n)}, {n}});
  return layouts;
}

std::vector<std::vector<float>> Initial() {
  std::vector<std::vector<float>> init;
  for (uint64_t n : kSizes) {
    std::vector<float> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = 0.02f * std::sin(float(i + n));
    init.push_back(std::move(v));
  }
  return init;
}

// What travels: FP4 under Nesterov, or SparseLoCo's sparse int2 (3 of each chunk of 64) under SGD.
struct Wire {
  compression::CodecSpec codec = *compression::ParseCodec("fp4_e2m1");
  OuterOptimizerConfig optimizer = {0.7, 0.9, true};
  float decay = 1;  // error feedback's beta
};

Wire SparseWire() {
  Wire w;
  w.codec = *compression::MakeSpec(int(compression::Codec::kInt2), 64, 3);
  w.optimizer.name = "sgd";
  w.optimizer.lr = 2;
  w.decay = 0.8f;
  return w;
}

SyncServerOptions Options(int shard, uint32_t shards, const Wire& wire = {}) {
  SyncServerOptions o;
  o.run_id = "run";
  o.optimizer = wire.optimizer;
  o.num_data_streams = 2;
  o.codec = wire.codec;
  o.chunk_bytes = 128;
  o.num_shards = shards;
  o.shard = shard;
  return o;
}

// An unsharded service, or a coordinator and its shards, with the islands' transports.
struct Service {
  explicit Service(uint32_t shards, const Wire& wire = {}) {
    coordinator = std::make_unique<SyncServer>(
        Options(shards > 1 ? SyncServerOptions::kControlPlane : 0, shards, wire), Layouts(),
        Initial());
    for (uint32_t k = 0; shards > 1 && k < shards; ++k) {
      servers.push_back(
          std::make_unique<SyncServer>(Options(int(k), shards, wire), Layouts(), Initial()));
    }
  }
  std::string Address(size_t k) const { return absl::StrCat("shard", k); }
  // Each shard reports to the coordinator and mirrors its membership (the gRPC link's one call).
  void Mirror() {
    for (size_t k = 0; k < servers.size(); ++k) {
      auto view = coordinator->ShardSync(servers[k]->ShardReport(Address(k)), absl::Now());
      ASSERT_TRUE(view.ok()) << view.status();
      servers[k]->MirrorMembership(*view);
    }
  }
  std::unique_ptr<Transport> Router() {
    return std::make_unique<ShardRouter>(
        std::make_unique<InProcessTransport>(coordinator.get()),
        [this](const std::string& address) -> absl::StatusOr<std::unique_ptr<Transport>> {
          for (size_t k = 0; k < servers.size(); ++k) {
            if (Address(k) == address) return std::make_unique<InProcessTransport>(servers[k].get());
          }
          return absl::NotFoundError(address);
        });
  }
  // The global parameters of `fragment`, wherever they live.
  std::vector<float> Params(uint32_t fragment) const {
    return servers.empty() ? coordinator->params(fragment)
                           : servers[fragment % servers.size()]->params(fragment);
  }
  std::unique_ptr<SyncServer> coordinator;
  std::vector<std::unique_ptr<SyncServer>> servers;
};

pb::JoinResponse JoinAs(Transport& t, const std::string& name) {
  pb::JoinRequest r;
  r.set_run_id("run");
  r.set_name(name);
  auto j = t.Join(r);
  EXPECT_TRUE(j.ok()) << j.status();
  if (j.ok()) t.Route(*j);
  return j.ok() ? *j : pb::JoinResponse();
}

// Two islands, three fragments, four rounds each, with error feedback: the global parameters of
// every fragment after every round, with one service or with `shards`.
std::vector<std::vector<float>> Trace(uint32_t shards, const Wire& wire) {
  Service service(shards, wire);
  if (shards > 1) service.Mirror();  // the shards register: joins are taken from now on
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::vector<std::unique_ptr<IslandSync>>> islands(2);
  for (int i = 0; i < 2; ++i) {
    transports.push_back(service.Router());
    const std::string name = i == 0 ? "a" : "b";
    const pb::JoinResponse joined = JoinAs(*transports.back(), name);
    EXPECT_EQ(joined.shards_size(), shards > 1 ? int(shards) : 0);
    auto id = std::make_shared<IslandIdentity>(name, joined.session());
    for (uint32_t f = 0; f < 3; ++f) {
      IslandSyncOptions so;
      so.codec = wire.codec;
      so.chunk_bytes = 128;
      so.error_feedback = true;
      so.error_feedback_decay = wire.decay;
      so.fragment = f;
      so.seed = 11 + uint64_t(i);
      islands[size_t(i)].push_back(
          std::make_unique<IslandSync>(transports.back().get(), "run", id, kSizes[f], so));
    }
  }
  if (shards > 1) service.Mirror();
  std::vector<std::vector<float>> trace;
  for (uint32_t f = 0; f < 3; ++f) {
    for (auto& island : islands) EXPECT_TRUE(island[f]->FetchGlobal().ok());
  }
  for (int round = 0; round < 4; ++round) {
    for (uint32_t f = 0; f < 3; ++f) {
      absl::StatusOr<RoundOutcome> out[2];
      std::thread t([&] {
        std::vector<float> local = islands[0][f]->global();
        for (size_t k = 0; k < local.size(); ++k) local[k] += 0.01f * std::cos(float(k + round));
        out[0] = islands[0][f]->SyncRound(local, 100);
      });
      std::vector<float> local = islands[1][f]->global();
      for (size_t k = 0; k < local.size(); ++k) local[k] -= 0.004f * std::sin(float(k * round));
      out[1] = islands[1][f]->SyncRound(local, 60);
      t.join();
      EXPECT_TRUE(out[0].ok() && out[1].ok()) << out[0].status() << out[1].status();
      EXPECT_EQ(islands[0][f]->global(), service.Params(f));
      EXPECT_EQ(islands[1][f]->global(), service.Params(f));
      trace.push_back(service.Params(f));
    }
  }
  if (shards > 1) {
    // The coordinator holds no fragment's data and knows the rounds from the shards' reports.
    service.Mirror();
    EXPECT_EQ(service.coordinator->committed_rounds(), 12u);
    EXPECT_TRUE(service.coordinator->params(1).empty());
    EXPECT_EQ(service.servers[0]->committed_rounds(), 8u);  // fragments 0 and 2
    EXPECT_EQ(service.servers[1]->committed_rounds(), 4u);  // fragment 1
  }
  return trace;
}

TEST(ShardedServiceTest, TwoShardsChangeNoBitOfAnyFragment) {
  const auto one = Trace(1, Wire());
  const auto two = Trace(2, Wire());
  ASSERT_EQ(one.size(), 12u);
  EXPECT_EQ(two, one);
}

// The same with SparseLoCo's sparse 2-bit pseudo-gradients, union updates and outer SGD.
TEST(ShardedServiceTest, TwoShardsChangeNoBitOfASparseRun) {
  const auto one = Trace(1, SparseWire());
  const auto two = Trace(2, SparseWire());
  ASSERT_EQ(one.size(), 12u);
  EXPECT_EQ(two, one);
  EXPECT_NE(one.back(), Initial()[2]);  // the rounds moved the parameters
}

// Membership lives at the coordinator: shards refuse membership calls, answer islands they have
// not heard of yet with UNAVAILABLE (retry), and go on without an island once the coordinator
// says it left; the coordinator takes joins only once every shard has called, and refuses data.
TEST(ShardedServiceTest, ShardsMirrorTheCoordinatorsMembership) {
  Service service(2);
  pb::JoinRequest join;
  join.set_run_id("run");
  join.set_name("a");
  EXPECT_EQ(service.coordinator->Join(join).status().code(), absl::StatusCode::kUnavailable);
  auto refused = service.servers[0]->Join(join);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("go to the run's coordinator"), std::string::npos);
  service.Mirror();
  auto router = service.Router();
  const pb::JoinResponse a = JoinAs(*router, "a");
  auto other = service.Router();
  const pb::JoinResponse b = JoinAs(*other, "b");
  EXPECT_EQ(a.shards(0), "shard0");
  EXPECT_EQ(a.shards(1), "shard1");

  // Shard 1 has not mirrored the joins yet.
  pb::FetchStateRequest fetch;
  fetch.set_run_id("run");
  fetch.set_island_id("a");
  fetch.set_session(a.session());
  fetch.set_fragment(1);
  auto sink = [](pb::StateChunk&&) { return absl::OkStatus(); };
  EXPECT_EQ(router->FetchState(fetch, sink, 0).code(), absl::StatusCode::kUnavailable);
  service.Mirror();
  EXPECT_TRUE(router->FetchState(fetch, sink, 0).ok());
  // A wrong session is refused, and the coordinator serves no data.
  fetch.set_session(b.session());
  EXPECT_FALSE(router->FetchState(fetch, sink, 0).ok());
  // What a shard reads (as could anyone holding the run token) has digests of the sessions, which
  // do not pass for them.
  auto view = service.coordinator->ShardSync(service.servers[1]->ShardReport("shard1"), absl::Now());
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->members_size(), 2);
  for (const auto& m : view->members()) {
    EXPECT_NE(m.session_sha256(), a.session());
    EXPECT_NE(m.session_sha256(), b.session());
    fetch.set_island_id(m.island_id());
    fetch.set_session(m.session_sha256());
    EXPECT_FALSE(router->FetchState(fetch, sink, 0).ok());
  }
  fetch.set_island_id("a");
  fetch.set_session(a.session());
  auto at_coordinator = InProcessTransport(service.coordinator.get()).FetchState(fetch, sink, 0);
  EXPECT_EQ(at_coordinator.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(at_coordinator.message().find("served by shard 1 of 2"), std::string::npos);

  // Island a pushes fragment 1; the round would wait for b, which leaves at the coordinator.
  IslandSyncOptions so;
  so.codec = *compression::ParseCodec("fp4_e2m1");
  so.chunk_bytes = 128;
  so.fragment = 1;
  IslandSync sync(router.get(), "run", std::make_shared<IslandIdentity>("a", a.session()), 500, so);
  ASSERT_TRUE(sync.FetchGlobal().ok());
  std::vector<float> local = sync.global();
  for (auto& v : local) v += 0.01f;
  absl::StatusOr<RoundOutcome> out;
  std::thread t([&] { out = sync.SyncRound(local, 10); });
  // Whichever comes first, a's push or b's leaving, the round commits with a alone once the shard
  // has mirrored the leave.
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("b");
  leave.set_session(b.session());
  ASSERT_TRUE(service.coordinator->Leave(leave).ok());
  service.Mirror();
  t.join();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(service.servers[1]->round(1), 1u);
  EXPECT_EQ(sync.global(), service.servers[1]->params(1));
  service.Mirror();
  EXPECT_EQ(service.coordinator->round(1), 1u);
  // b is gone at the shard too, with the reason the coordinator gave.
  fetch.set_island_id("b");
  fetch.set_session(b.session());
  auto gone = router->FetchState(fetch, sink, 0);
  EXPECT_EQ(gone.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(gone.message().find("it left"), std::string::npos);
}

// Once every member has finished, every round has committed, but the coordinator knows a shard's
// rounds as of the shard's last report. A heartbeat counts the run as training until every shard
// has reported after the last member finished: the versions a finished island then catches up to
// are the shards' last rounds, not older ones.
TEST(ShardedServiceTest, TheRunEndsOnceEveryShardHasReportedItsLastRounds) {
  Service service(2);
  service.Mirror();
  auto router_a = service.Router(), router_b = service.Router();
  const pb::JoinResponse a = JoinAs(*router_a, "a"), b = JoinAs(*router_b, "b");
  service.Mirror();
  // a and b push fragment 1: its round 0 commits at shard 1, which has not reported it since.
  IslandSyncOptions so;
  so.codec = *compression::ParseCodec("fp4_e2m1");
  so.chunk_bytes = 128;
  so.fragment = 1;
  IslandSync sa(router_a.get(), "run", std::make_shared<IslandIdentity>("a", a.session()), 500, so);
  IslandSync sb(router_b.get(), "run", std::make_shared<IslandIdentity>("b", b.session()), 500, so);
  ASSERT_TRUE(sa.FetchGlobal().ok() && sb.FetchGlobal().ok());
  std::vector<float> la = sa.global(), lb = sb.global();
  for (size_t i = 0; i < la.size(); ++i) {
    la[i] += 0.01f;
    lb[i] -= 0.002f * float(i % 5);
  }
  absl::StatusOr<RoundOutcome> ra;
  std::thread t([&] { ra = sa.SyncRound(la, 10); });
  auto rb = sb.SyncRound(lb, 10);
  t.join();
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  ASSERT_EQ(service.servers[1]->round(1), 1u);
  auto finished = [&](const pb::JoinResponse& island) {
    pb::HeartbeatRequest r;
    r.set_run_id("run");
    r.set_island_id(island.island_id());
    r.set_session(island.session());
    r.set_finished(true);
    auto answer = service.coordinator->Heartbeat(r);
    EXPECT_TRUE(answer.ok()) << answer.status();
    return answer.ok() ? *answer : pb::HeartbeatResponse();
  };
  EXPECT_EQ(finished(a).training_members(), 1u);  // b trains
  // Every member has finished; the shards' last reports were made before that.
  EXPECT_EQ(finished(b).training_members(), 2u);
  EXPECT_EQ(finished(a).versions(1), 0u);
  service.Mirror();  // answers the shards' long polls, as it would at once
  EXPECT_EQ(finished(a).training_members(), 2u);
  service.Mirror();  // their next reports, made after the end
  const pb::HeartbeatResponse end = finished(a);
  EXPECT_EQ(end.training_members(), 0u);
  ASSERT_EQ(end.versions_size(), 3);
  EXPECT_EQ(end.versions(1), 1u);
}

// A shard's durable state holds its own fragments only, and only that shard takes it back.
TEST(ShardedServiceTest, EachShardSnapshotsAndRestoresItsOwnFragments) {
  Service service(2);
  std::map<std::pair<uint32_t, std::string>, std::vector<float>> tensors;
  auto state = service.servers[0]->Snapshot(
      [&](uint32_t fragment, const std::string& t, const float* data, size_t n) {
        tensors[{fragment, t}] = std::vector<float>(data, data + n);
        return absl::OkStatus();
      });
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->fragments_size(), 2);
  EXPECT_EQ(state->fragments(0).fragment(), 0u);
  EXPECT_EQ(state->fragments(1).fragment(), 2u);
  auto read = [&](uint32_t index, const std::string& t, float* out, size_t n) {
    const auto& v = tensors[{state->fragments(int(index)).fragment(), t}];
    if (v.size() != n) return absl::DataLossError("size");
    std::copy(v.begin(), v.end(), out);
    return absl::OkStatus();
  };
  SyncServer again(Options(0, 2), Layouts(), Initial());
  EXPECT_TRUE(again.Restore(*state, read).ok());
  SyncServer other(Options(1, 2), Layouts(), Initial());
  auto wrong = other.Restore(*state, read);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition) << wrong;
}

}  // namespace
}  // namespace atl::outer
