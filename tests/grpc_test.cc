// The outer-sync service over real gRPC on loopback: authentication, refusals of bad input with
// the state untouched byte for byte, and a multi-process run of coordinator + 2 islands.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "compression/checksum.h"
#include "outer/payload.h"
#include "src/grpc_server.h"
#include "src/grpc_transport.h"
#include "tests/test_util.h"

namespace atl {
namespace {

using ::testing::HasSubstr;

class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    outer::SyncServerOptions o;
    o.run_id = "run";
    o.num_data_streams = 2;
    outer::FragmentLayout layout{{"w"}, {6}};
    sync_ = std::make_unique<outer::SyncServer>(o, layout, std::vector<float>{1, 2, 3, 4, 5, 6});
    GrpcServerOptions so;
    so.listen = "127.0.0.1:0";
    so.token = "right-token";
    auto server = GrpcServer::Start(sync_.get(), so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = Client("right-token");
    pb::JoinRequest j;
    j.set_run_id("run");
    for (const char* name : {"a", "b"}) {
      j.set_name(name);
      auto joined = client_->Join(j);
      ASSERT_TRUE(joined.ok()) << joined.status();
      sessions_[name] = joined->session();
    }
  }
  std::unique_ptr<GrpcTransport> Client(const std::string& token) {
    GrpcTransportOptions t;
    t.target = server_->address();
    t.token = token;
    t.rpc_timeout_s = 10;
    t.round_timeout_s = 5;
    return *GrpcTransport::Create(t);
  }
  std::vector<pb::PushRequest> Payload(const std::string& island, uint64_t round,
                                       std::vector<float> delta) {
    auto chunks = *outer::EncodeChunks({"run", island, round, 0}, {compression::Codec::kFp32, 0},
                                       delta.data(), 0, delta.size(), delta.size(), 8);
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(5);
    }
    out[0].set_session(sessions_[island]);
    return out;
  }
  std::unique_ptr<outer::SyncServer> sync_;
  std::map<std::string, std::string> sessions_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<GrpcTransport> client_;
};

TEST_F(GrpcServiceTest, WrongTokenIsUnauthenticatedAndChangesNothing) {
  const auto before = sync_->params();
  for (const std::string token : {"wrong-token", "", "right-toke"}) {
    auto bad = Client(token);
    pb::JoinRequest j;
    j.set_run_id("run");
    j.set_name("intruder");
    EXPECT_EQ(bad->Join(j).status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(bad->Push(Payload("a", 0, {1, 1, 1, 1, 1, 1})).status().code(),
              absl::StatusCode::kUnauthenticated);
    pb::FetchStateRequest f;
    f.set_run_id("run");
    EXPECT_EQ(bad->FetchState(f).status().code(), absl::StatusCode::kUnauthenticated);
    pb::LeaveRequest l;
    l.set_run_id("run");
    l.set_island_id("a");
    EXPECT_EQ(bad->Leave(l).code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(sync_->params(), before);
  EXPECT_EQ(sync_->GetState().islands_size(), 2);
  EXPECT_EQ(sync_->round(), 0u);
}

TEST_F(GrpcServiceTest, BadInputIsRefusedWithACanonicalStatusAndStateUntouched) {
  const auto before = sync_->params();
  const uint64_t hash = sync_->params_hash();
  auto corrupt = Payload("a", 0, {1, 1, 1, 1, 1, 1});
  corrupt[1].mutable_chunk()->mutable_data()->at(0) ^= 0x40;
  auto nan = Payload("a", 0, {1, 1, 1, 1, 1, 1});
  const float bad = std::nanf("");
  std::memcpy(nan[2].mutable_chunk()->mutable_data()->data(), &bad, 4);
  nan[2].mutable_chunk()->set_xxh64(
      compression::Checksum(nan[2].chunk().data().data(), nan[2].chunk().data().size()));
  auto fragment = Payload("a", 0, {1, 1, 1, 1, 1, 1});
  for (auto& r : fragment) r.mutable_chunk()->mutable_header()->set_fragment(2);
  auto run = Payload("a", 0, {1, 1, 1, 1, 1, 1});
  for (auto& r : run) r.mutable_chunk()->mutable_header()->set_run_id("elsewhere");
  auto shape = Payload("a", 0, {1, 1, 1, 1});
  auto missing = Payload("a", 0, {1, 1, 1, 1, 1, 1});
  missing.pop_back();
  auto oversized = Payload("a", 0, {1, 1, 1, 1, 1, 1});
  oversized.push_back(oversized[0]);
  struct Case {
    std::vector<pb::PushRequest> payload;
    absl::StatusCode code;
    const char* message;
  } cases[] = {
      {corrupt, absl::StatusCode::kDataLoss, "checksum mismatch"},
      {nan, absl::StatusCode::kInvalidArgument, "non-finite"},
      {fragment, absl::StatusCode::kNotFound, "unknown fragment 2"},
      {run, absl::StatusCode::kNotFound, "unknown run 'elsewhere'"},
      {shape, absl::StatusCode::kInvalidArgument, "fragment has 6 elements"},
      {missing, absl::StatusCode::kInvalidArgument, "incomplete: 4 of 6"},
      {oversized, absl::StatusCode::kInvalidArgument, "after the last chunk"},
      {Payload("a", 3, {1, 1, 1, 1, 1, 1}), absl::StatusCode::kFailedPrecondition,
       "round 3 of fragment 0 is unknown"},
      {Payload("zed", 0, {1, 1, 1, 1, 1, 1}), absl::StatusCode::kPermissionDenied, "not a member"},
  };
  for (auto& c : cases) {
    auto r = client_->Push(c.payload);
    EXPECT_EQ(r.status().code(), c.code) << c.message << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    EXPECT_EQ(sync_->params(), before);
    EXPECT_EQ(sync_->params_hash(), hash);
  }
  // A good contribution, then its duplicate, then a stale one after the round commits.
  ASSERT_TRUE(client_->Push(Payload("a", 0, {1, 1, 1, 1, 1, 1})).ok());
  EXPECT_EQ(client_->Push(Payload("a", 0, {1, 1, 1, 1, 1, 1})).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(sync_->params(), before);
  ASSERT_TRUE(client_->Push(Payload("b", 0, {0, 0, 0, 0, 0, 0})).ok());
  EXPECT_EQ(sync_->round(), 1u);
  const auto after = sync_->params();
  auto stale = client_->Push(Payload("b", 0, {1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.status().message()), HasSubstr("already committed"));
  EXPECT_EQ(sync_->params(), after);
  // Fetching the state returns exactly the service's parameters, resumable from an offset.
  pb::FetchStateRequest f;
  f.set_run_id("run");
  f.set_island_id("a");
  f.set_session(sessions_["a"]);
  f.set_offset(2);
  auto state = client_->FetchState(f);
  ASSERT_TRUE(state.ok());
  outer::Assembler assembler({"run", "", 1, 0}, 6, 2, 4);
  for (const auto& s : *state) ASSERT_TRUE(assembler.Add(s.chunk()).ok());
  EXPECT_EQ(assembler.values(), std::vector<float>(after.begin() + 2, after.end()));
  f.set_run_id("nope");
  EXPECT_EQ(client_->FetchState(f).status().code(), absl::StatusCode::kNotFound);
}

TEST(GrpcTlsTest, TlsWithTheRightRootWorksPlaintextDoesNot) {
  testing::TempDir dir;
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -keyout " +
      dir.Join("key.pem") + " -out " + dir.Join("cert.pem") +
      " -addext subjectAltName=IP:127.0.0.1,DNS:localhost >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  outer::SyncServerOptions o;
  o.run_id = "run";
  outer::SyncServer sync(o, {{"w"}, {2}}, {1, 2});
  GrpcServerOptions so;
  so.token = "t";
  so.tls = {dir.Join("cert.pem"), dir.Join("key.pem"), ""};
  auto server = GrpcServer::Start(&sync, so);
  ASSERT_TRUE(server.ok()) << server.status();
  pb::JoinRequest j;
  j.set_run_id("run");
  j.set_name("a");
  GrpcTransportOptions t;
  t.target = (*server)->address();
  t.token = "t";
  t.rpc_timeout_s = 1;
  auto plaintext = *GrpcTransport::Create(t);
  EXPECT_EQ(plaintext->Join(j).status().code(), absl::StatusCode::kDeadlineExceeded);
  t.rpc_timeout_s = 10;
  t.tls.ca = dir.Join("cert.pem");
  auto secure = *GrpcTransport::Create(t);
  auto joined = secure->Join(j);
  EXPECT_TRUE(joined.ok()) << joined.status();
  t.tls.ca = dir.Join("missing.pem");
  EXPECT_EQ(GrpcTransport::Create(t).status().code(), absl::StatusCode::kNotFound);
}

// (c) Coordinator + 2 islands as separate processes over TCP on loopback: plain DiLoCo, and
// Streaming DiLoCo with 4 fragments, tau = 2 and FP4 payloads.
testing::CommandResult RunTwoIslands(const testing::TempDir& dir, const std::string& outer_toml,
                                     const std::string& extra_args = "") {
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 9));
  testing::WriteFile(dir.Join("run.toml"),
                     "[model]\nn_layer = 4\nd_model = 32\nn_head = 2\ncontext = 32\n"
                     "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                     "[train]\nsteps = 12\nbatch_size = 4\neval_every = 8\neval_batches = 2\n"
                     "threads = 1\n[optim]\nwarmup_steps = 2\n[outer]\n" + outer_toml);
  return testing::RunCommand(std::string(ATOLL_BIN) + " local --islands 2 --config " +
                             dir.Join("run.toml") + " --run-dir " + dir.Join("run") + " " +
                             extra_args);
}

// The service's hash after each round (version) of each fragment, in order.
std::map<int, std::vector<std::string>> ServiceHashes(const testing::TempDir& dir) {
  std::map<int, std::vector<std::string>> service;
  std::ifstream rounds(dir.Join("run/coordinator/rounds.jsonl"));
  for (std::string line; std::getline(rounds, line);) {
    auto j = nlohmann::json::parse(line);
    service[j["fragment"].get<int>()].push_back(j["params_hash"]);
  }
  return service;
}

void RunAndCheckBitIdentical(const std::string& outer_toml, int fragments) {
  testing::TempDir dir;
  const auto run = RunTwoIslands(dir, outer_toml);
  ASSERT_EQ(run.exit_code, 0) << run.output;

  // The service's hash after each round of each fragment...
  const auto service = ServiceHashes(dir);
  ASSERT_EQ(service.size(), size_t(fragments));
  // ...equals each island's after the same round.
  for (const char* island : {"island0", "island1"}) {
    std::ifstream metrics(dir.Join(std::string("run/") + island + "/metrics.jsonl"));
    std::map<int, std::vector<std::string>> seen;
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("round")) {
        EXPECT_FALSE(j["resynced"].get<bool>());
        seen[j["fragment"].get<int>()].push_back(j["global_hash"]);
      }
    }
    EXPECT_EQ(seen, service) << island;
    auto summary = nlohmann::json::parse(
        testing::ReadFile(dir.Join(std::string("run/") + island + "/summary.json")));
    EXPECT_EQ(summary["resyncs"], 0);
  }
  auto s0 = nlohmann::json::parse(testing::ReadFile(dir.Join("run/island0/summary.json")));
  auto s1 = nlohmann::json::parse(testing::ReadFile(dir.Join("run/island1/summary.json")));
  EXPECT_EQ(s0["global_hash"], s1["global_hash"]);
}

TEST(MultiProcessTest, IslandsAndServiceEndBitIdentical) {
  RunAndCheckBitIdentical("sync_every = 4\n", 1);
}

TEST(MultiProcessTest, StreamingFourFragmentsOverlappedFp4) {
  RunAndCheckBitIdentical(
      "sync_every = 4\nnum_fragments = 4\nfragment_sync_delay = 2\ncodec = \"fp4_e2m1\"\n"
      "stochastic_rounding = true\n",
      4);
}

// Async mode, island1 eight times slower (a margin over the scheduling noise of steps this small):
// every contribution is applied as it arrives, each island's copy matches the service's at the
// version it caught up to, and both end on the final state.
TEST(MultiProcessTest, AsyncWithAThrottledIslandStaysBitIdentical) {
  testing::TempDir dir;
  // 40 steps per island of budget: long enough for several pushes of the slow island after the
  // fast one has reported its throughput.
  const auto run = RunTwoIslands(dir, "sync_every = 4\nmode = \"async\"\nmax_staleness = 64\n",
                                 "--throttle 1,8 --train.steps=40");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto service = ServiceHashes(dir);
  ASSERT_EQ(service.size(), 1u);
  const auto& versions = service.at(0);
  int64_t tokens = 0;
  int64_t min_h[2] = {4, 4};  // smallest H each island was given
  for (int i = 0; i < 2; ++i) {
    const std::string island = "island" + std::to_string(i);
    std::ifstream metrics(dir.Join("run/" + island + "/metrics.jsonl"));
    int contributions = 0;
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (!j.contains("round")) continue;
      ++contributions;
      // (A contribution refused as too stale on a loaded machine makes the island fetch the state:
      // its copy must then equal the service's at the version fetched, like any other.)
      const size_t v = j["version"].get<size_t>();
      ASSERT_GE(v, 1u);
      ASSERT_LE(v, versions.size());
      EXPECT_EQ(j["global_hash"], versions[v - 1]) << island << " at version " << v;
      min_h[i] = std::min(min_h[i], j["sync_every"].get<int64_t>());
    }
    EXPECT_GT(contributions, 0) << island;
    auto summary =
        nlohmann::json::parse(testing::ReadFile(dir.Join("run/" + island + "/summary.json")));
    EXPECT_EQ(summary["global_hash"], versions.back()) << island;
    tokens += summary["tokens"].get<int64_t>();
  }
  // Dynamic local steps: the slow island is told to sync after fewer steps than H = 4 (the fast
  // one's H depends on how the machine schedules two processes, so it is not checked); together
  // they spend the budget of 2 islands x 40 steps x 4 x 32 tokens.
  EXPECT_LT(min_h[1], 4);
  EXPECT_GE(tokens, 2 * 40 * 4 * 32);
  EXPECT_THAT(run.output, ::testing::HasSubstr("throttled 8.0x"));
}

// Chaos, CI-sized: 3 islands; island1 is SIGKILLed after round 2, island3 joins after round 3
// (taking the dead island's data stream once its lease has run out), the coordinator is SIGKILLed
// after round 6 and restarted from its durable state (the islands rejoin), island2 leaves with
// SIGTERM after round 9. Training reaches its last step; every round commits exactly once and in
// order; the islands alive at the end hold the service's final parameters bit for bit.
TEST(ChaosTest, KillJoinAndLeaveWhileTraining) {
  testing::TempDir dir;
  testing::WriteFile(dir.Join("text.txt"), testing::GeneratedText(60000, 9));
  testing::WriteFile(dir.Join("run.toml"),
                     "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
                     "[data]\npath = \"" + dir.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                     "[train]\nsteps = 80\nbatch_size = 4\neval_every = 0\neval_batches = 2\n"
                     "threads = 1\n[optim]\nwarmup_steps = 2\n"
                     "[outer]\nsync_every = 4\nheartbeat_s = 0.2\nlease_s = 1.5\n"
                     "join_warmup_steps = 4\n");
  // Throttled, so that the run lasts a few seconds: long enough for a process to start and join.
  const auto run = testing::RunCommand(
      std::string(ATOLL_BIN) + " local --islands 3 --config " + dir.Join("run.toml") +
      " --run-dir " + dir.Join("run") + " --throttle 4,4,4" +
      " --kill island1@round2 --join island3@round3 --kill coordinator@round6" +
      " --term island2@round9");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("sending SIGKILL to island1"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("island 'island1' declared dead"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("island 'island3' joined at round"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("island 'island2' left at round"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("atoll coordinator: resumed run 'atoll' at round"));
  EXPECT_THAT(run.output, ::testing::HasSubstr("[island0] rejoined at round"));

  std::vector<uint64_t> rounds;
  std::vector<std::string> hashes;
  std::ifstream log(dir.Join("run/coordinator/rounds.jsonl"));
  for (std::string line; std::getline(log, line);) {
    auto j = nlohmann::json::parse(line);
    rounds.push_back(j["round"].get<uint64_t>());
    hashes.push_back(j["params_hash"]);
  }
  std::vector<uint64_t> expected(20);
  for (uint64_t r = 0; r < 20; ++r) expected[r] = r;
  EXPECT_EQ(rounds, expected);  // none lost, none applied twice
  for (const char* island : {"island0", "island3"}) {
    auto summary =
        nlohmann::json::parse(testing::ReadFile(dir.Join(std::string("run/") + island + "/summary.json")));
    EXPECT_EQ(summary["step"], 80) << island;
    EXPECT_EQ(summary["global_hash"], hashes.back()) << island;
    const double loss = summary["val_loss"].get<double>();
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_LT(loss, std::log(256.0));  // below a uniform guess over bytes
  }
}

// An island killed mid-run comes back from its own checkpoint (written in the background every
// 4 steps): it rejoins under its name, restores its AdamW state and data cursor, fetches the
// global parameters, and the run ends with every copy bit-identical.
TEST(ChaosTest, AKilledIslandResumesFromItsCheckpoint) {
  testing::TempDir dir;
  const auto run = RunTwoIslands(
      dir,
      "sync_every = 4\nheartbeat_s = 0.2\nlease_s = 1.0\n",
      "--throttle 4,4 --train.steps=40 --train.checkpoint_every=4 --kill island1@round3 "
      "--join island1@round4");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, ::testing::HasSubstr("[island1] resumed from its checkpoint of step"));
  const auto service = ServiceHashes(dir);
  ASSERT_EQ(service.at(0).size(), 10u);
  for (const char* island : {"island0", "island1"}) {
    auto summary =
        nlohmann::json::parse(testing::ReadFile(dir.Join(std::string("run/") + island + "/summary.json")));
    EXPECT_EQ(summary["global_hash"], service.at(0).back()) << island;
    EXPECT_EQ(summary["step"], 40) << island;
    EXPECT_GT(summary["checkpoints"].get<int>(), 0) << island;
  }
}

}  // namespace
}  // namespace atl
