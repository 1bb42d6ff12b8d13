// The outer-sync service over real gRPC on loopback: authentication, refusals of bad input with
// the state untouched byte for byte, TLS, resource limits, start-up errors. Whole runs of
// separate processes are in multiprocess_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "compression/checksum.h"
#include "outer/island/island_sync.h"
#include "outer/base/payload.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "src/net/grpc_server.h"
#include "src/net/grpc_transport.h"
#include "src/cli/chaos.h"
#include "tests/src/net/run_util.h"
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
    EXPECT_EQ(testing::PushAll(*bad, Payload("a", 0, {1, 1, 1, 1, 1, 1})).status().code(),
              absl::StatusCode::kUnauthenticated);
    pb::FetchStateRequest f;
    f.set_run_id("run");
    EXPECT_EQ(testing::FetchAll(*bad, f).status().code(), absl::StatusCode::kUnauthenticated);
    pb::LeaveRequest l;
    l.set_run_id("run");
    l.set_island_id("a");
    EXPECT_EQ(bad->Leave(l).code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(sync_->params(), before);
  EXPECT_EQ(sync_->GetState().islands_size(), 2);
  EXPECT_EQ(sync_->round(), 0u);
}

// The coordinator of a sharded service hands the membership (session digests, and where each
// fragment lives) only to callers holding the shard token: an island's run token cannot register
// a shard of its own and draw other islands' data to it.
TEST(GrpcShardTest, OnlyTheShardTokenRegistersAShard) {
  outer::SyncServerOptions o;
  o.run_id = "run";
  o.num_shards = 2;
  o.shard = outer::SyncServerOptions::kControlPlane;
  outer::SyncServer sync(o, {{{"w"}, {4}}, {{"v"}, {4}}}, {{1, 2, 3, 4}, {5, 6, 7, 8}});
  GrpcServerOptions so;
  so.listen = "127.0.0.1:0";
  so.token = "run-token";
  so.shard_token = "shard-token";
  auto server = GrpcServer::Start(&sync, so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto call = [&](const std::string& token) {
    GrpcTransportOptions t;
    t.target = (*server)->address();
    t.token = token;
    t.rpc_timeout_s = 4;
    pb::ShardSyncRequest r;
    r.set_run_id("run");
    r.set_shard(0);
    r.set_num_shards(2);
    r.set_address("127.0.0.1:1");
    r.add_rounds(0);
    return (*GrpcTransport::Create(t))->ShardSync(r);
  };
  auto refused = call("run-token");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("shard token"));
  pb::JoinRequest j;
  j.set_run_id("run");
  j.set_name("a");
  // Not registered: joins still wait for shard 0.
  EXPECT_THAT(std::string(sync.Join(j).status().message()), HasSubstr("shard 0 of 2"));
  EXPECT_TRUE(call("shard-token").ok());
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
      {missing, absl::StatusCode::kInvalidArgument, "incomplete: 2 of 3 chunks"},
      {oversized, absl::StatusCode::kInvalidArgument, "after the last chunk"},
      {Payload("a", 3, {1, 1, 1, 1, 1, 1}), absl::StatusCode::kFailedPrecondition,
       "round 3 of fragment 0 is unknown"},
      {Payload("zed", 0, {1, 1, 1, 1, 1, 1}), absl::StatusCode::kPermissionDenied, "not a member"},
  };
  for (auto& c : cases) {
    auto r = testing::PushAll(*client_, c.payload);
    EXPECT_EQ(r.status().code(), c.code) << c.message << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    EXPECT_EQ(sync_->params(), before);
    EXPECT_EQ(sync_->params_hash(), hash);
  }
  // A good contribution, then its duplicate, then the same again after the round commits.
  ASSERT_TRUE(testing::PushAll(*client_, Payload("a", 0, {1, 1, 1, 1, 1, 1})).ok());
  EXPECT_EQ(testing::PushAll(*client_, Payload("a", 0, {1, 1, 1, 1, 1, 1})).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(sync_->params(), before);
  ASSERT_TRUE(testing::PushAll(*client_, Payload("b", 0, {0, 0, 0, 0, 0, 0})).ok());
  EXPECT_EQ(sync_->round(), 1u);
  const auto after = sync_->params();
  auto again = testing::PushAll(*client_, Payload("b", 0, {1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("has already contributed to round 0"));
  EXPECT_EQ(sync_->params(), after);
  // Fetching the state returns exactly the service's parameters, resumable from an offset.
  pb::FetchStateRequest f;
  f.set_run_id("run");
  f.set_island_id("a");
  f.set_session(sessions_["a"]);
  f.set_offset(2);
  auto state = testing::FetchAll(*client_, f);
  ASSERT_TRUE(state.ok());
  outer::Assembler assembler({"run", "", 1, 0}, 6, 2, 4);
  for (const auto& s : *state) ASSERT_TRUE(assembler.Add(s.chunk()).ok());
  EXPECT_EQ(assembler.values(), std::vector<float>(after.begin() + 2, after.end()));
  f.set_run_id("nope");
  EXPECT_EQ(testing::FetchAll(*client_, f).status().code(), absl::StatusCode::kNotFound);
}

// TCP connections of this network namespace that are established to `port` (client sides).
int ConnectionsTo(int port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = remote.rfind(':');
      if (state == "01" && colon != std::string::npos &&
          std::stoi(remote.substr(colon + 1), nullptr, 16) == port) {
        ++n;
      }
    }
  }
  return n;
}

// outer.connections = 3: the island's payloads travel on three TCP connections of their own, and
// the round comes out as with one; membership calls (a heartbeat here) take a fourth, which no
// payload shares.
TEST_F(GrpcServiceTest, ConnectionsStripeAnIslandsPayloadsOverThatManyTcpStreams) {
  const int port = std::stoi(server_->address().substr(server_->address().rfind(':') + 1));
  const int before = ConnectionsTo(port);  // the fixture's client, so far its membership calls
  GrpcTransportOptions t;
  t.target = server_->address();
  t.token = "right-token";
  t.connections = 3;
  auto striped = *GrpcTransport::Create(t);
  outer::IslandSyncOptions so;
  so.chunk_bytes = 8;  // 2 values a chunk: 3 chunks, one per connection
  auto identity = std::make_shared<outer::IslandIdentity>("a", sessions_["a"]);
  outer::IslandSync a(striped.get(), "run", identity, 6, so);
  ASSERT_TRUE(a.FetchGlobal().ok());
  absl::StatusOr<outer::RoundOutcome> round;
  std::thread island([&] { round = a.SyncRound({0, 1, 2, 3, 4, 5}, 5); });
  ASSERT_TRUE(testing::PushAll(*client_, Payload("b", 0, {1, 1, 1, 1, 1, 1})).ok());
  island.join();
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_EQ(a.global(), sync_->params());
  EXPECT_EQ(a.global_hash(), sync_->params_hash());
  pb::HeartbeatRequest beat;
  beat.set_run_id("run");
  beat.set_island_id("a");
  beat.set_session(sessions_["a"]);
  ASSERT_TRUE(striped->Heartbeat(beat).ok());
  // 3 payload connections and 1 for membership calls; and the fixture's client's first push
  // opened its own payload connection.
  EXPECT_EQ(ConnectionsTo(port) - before, 3 + 1 + 1);
  t.connections = 0;
  EXPECT_EQ(GrpcTransport::Create(t).status().code(), absl::StatusCode::kInvalidArgument);
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
  // Refused at once (the connection fails), not after the deadline.
  EXPECT_EQ(plaintext->Join(j).status().code(), absl::StatusCode::kUnavailable);
  t.rpc_timeout_s = 10;
  t.tls.ca = dir.Join("cert.pem");
  auto secure = *GrpcTransport::Create(t);
  auto joined = secure->Join(j);
  EXPECT_TRUE(joined.ok()) << joined.status();
  t.tls.ca = dir.Join("missing.pem");
  EXPECT_EQ(GrpcTransport::Create(t).status().code(), absl::StatusCode::kNotFound);
}

// Mutual TLS: each island's certificate names it; an island cannot join, heartbeat or push as
// another, even holding the run token and the other's session credential; no certificate, no call.
TEST(GrpcTlsTest, MutualTlsBindsEachIslandToItsCertificate) {
  testing::TempDir dir;
  const auto made = testing::RunCommand(std::string(ATOLL_SOURCE_DIR) + "/deploy/make_certs.sh " +
                                        dir.Join("certs") + " a b");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto file = [&](const std::string& name) { return dir.Join("certs/" + name); };
  outer::SyncServerOptions o;
  o.run_id = "run";
  o.num_data_streams = 2;
  outer::SyncServer sync(o, {{"w"}, {2}}, {1, 2});
  GrpcServerOptions so;
  so.token = "t";
  so.tls = {file("coordinator.pem"), file("coordinator.key"), file("ca.pem")};
  auto server = GrpcServer::Start(&sync, so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = [&](const std::string& island, double timeout_s = 10) {
    GrpcTransportOptions t;
    t.target = (*server)->address();
    t.token = "t";
    t.rpc_timeout_s = timeout_s;
    t.tls.ca = file("ca.pem");
    if (!island.empty()) {
      t.tls.cert = file(island + ".pem");
      t.tls.key = file(island + ".key");
    }
    return *GrpcTransport::Create(t);
  };
  auto a = client("a"), b = client("b");
  pb::JoinRequest j;
  j.set_run_id("run");
  j.set_name("a");
  auto b_as_a = b->Join(j);
  EXPECT_EQ(b_as_a.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(b_as_a.status().message()), HasSubstr("certificate is island 'b'"));
  auto joined_a = a->Join(j);
  ASSERT_TRUE(joined_a.ok()) << joined_a.status();
  j.set_name("b");
  auto joined_b = b->Join(j);
  ASSERT_TRUE(joined_b.ok()) << joined_b.status();
  // b presents a's own session credential, but its certificate is b's.
  pb::HeartbeatRequest beat;
  beat.set_run_id("run");
  beat.set_island_id("a");
  beat.set_session(joined_a->session());
  EXPECT_EQ(b->Heartbeat(beat).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(a->Heartbeat(beat).ok());
  pb::LeaveRequest leave;
  leave.set_run_id("run");
  leave.set_island_id("a");
  leave.set_session(joined_a->session());
  EXPECT_EQ(b->Leave(leave).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sync.num_members(), 2u);
  // Without a client certificate the handshake fails: nothing reaches the service.
  auto anonymous = client("", 2);
  j.set_name("c");
  EXPECT_FALSE(anonymous->Join(j).ok());
  EXPECT_EQ(sync.num_members(), 2u);
}

// Resource limits: calls beyond an island's share or the total are refused at once
// (RESOURCE_EXHAUSTED), and push streams that send nothing are cancelled after the idle timeout.
TEST(GrpcLimitsTest, CallCapsAndIdleStreams) {
  outer::SyncServerOptions o;
  o.run_id = "run";
  o.num_data_streams = 2;
  outer::SyncServer sync(o, {{"w"}, {2}}, {1, 2});
  GrpcServerOptions so;
  so.token = "t";
  so.max_pending_calls = 8;  // 2 from any one address
  so.max_calls_per_island = 2;
  so.stream_idle_timeout_s = 0.5;
  auto server = GrpcServer::Start(&sync, so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto stub = pb::OuterSync::NewStub(channel);
  auto coordinator = pb::Coordinator::NewStub(channel);
  auto prepare = [](grpc::ClientContext* ctx, double timeout_s) {
    ctx->AddMetadata("authorization", "Bearer t");
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(int(timeout_s * 1000)));
  };
  pb::JoinRequest j;
  j.set_run_id("run");
  j.set_name("a");
  pb::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    prepare(&ctx, 10);
    ASSERT_TRUE(coordinator->Join(&ctx, j, &joined).ok());
  }
  // Island a waits for round 0's update three times at once: the third is over its share.
  pb::UpdateRequest u;
  u.set_run_id("run");
  u.set_island_id("a");
  u.set_session(joined.session());
  std::vector<std::unique_ptr<grpc::ClientContext>> waits;
  std::vector<std::unique_ptr<grpc::ClientReader<pb::UpdateChunk>>> readers;
  for (int i = 0; i < 2; ++i) {
    waits.push_back(std::make_unique<grpc::ClientContext>());
    prepare(waits.back().get(), 30);
    readers.push_back(stub->AwaitUpdate(waits.back().get(), u));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both are waiting now
  {
    grpc::ClientContext ctx;
    prepare(&ctx, 10);
    auto third = stub->AwaitUpdate(&ctx, u);
    pb::UpdateChunk chunk;
    EXPECT_FALSE(third->Read(&chunk));
    const auto status = third->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("island 'a' already has 2 calls running"));
  }
  // Push streams that never send: one address's share of the calls not tied to a member (2 of
  // 8) refuses the third to the fifth at once...
  std::vector<std::unique_ptr<grpc::ClientContext>> idle;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::PushRequest>>> writers;
  std::vector<pb::PushResponse> responses(5);
  for (int i = 0; i < 5; ++i) {
    idle.push_back(std::make_unique<grpc::ClientContext>());
    prepare(idle.back().get(), 30);
    writers.push_back(stub->Push(idle.back().get(), &responses[size_t(i)]));
  }
  const auto t0 = std::chrono::steady_clock::now();
  int exhausted = 0, cancelled = 0;
  for (auto& w : writers) {
    const auto status = w->Finish();
    exhausted += status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    cancelled += status.error_code() == grpc::StatusCode::CANCELLED;
  }
  // ...and the other two are cancelled after 0.5 s without a first message, well within their
  // 30 s deadline.
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(exhausted, 3);
  EXPECT_EQ(cancelled, 2);
  EXPECT_LT(waited, 5.0);
  for (size_t i = 0; i < waits.size(); ++i) waits[i]->TryCancel();
  for (auto& r : readers) r->Finish();
}

// A coordinator that cannot listen says why and stops: a port in use (never shared), an address
// that is not HOST:PORT, swapped or unreadable TLS files.
TEST(GrpcStartTest, StartUpErrorsAreErrors) {
  testing::TempDir dir;
  outer::SyncServerOptions o;
  o.run_id = "run";
  outer::SyncServer sync(o, {{"w"}, {2}}, {1, 2});
  GrpcServerOptions so;
  so.token = "t";
  auto first = GrpcServer::Start(&sync, so);
  ASSERT_TRUE(first.ok()) << first.status();
  so.listen = (*first)->address();
  auto second = GrpcServer::Start(&sync, so);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
  for (const char* bad : {"localhost", "127.0.0.1:99999", "127.0.0.1:http", ":"}) {
    so.listen = bad;
    auto s = GrpcServer::Start(&sync, so);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << s.status();
  }
  so.listen = "203.0.113.7:0";  // an address this machine does not have
  auto foreign = GrpcServer::Start(&sync, so);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(foreign.status().message()), HasSubstr("assign"));
  const auto made = testing::RunCommand(std::string(ATOLL_SOURCE_DIR) + "/deploy/make_certs.sh " +
                                        dir.Join("certs") + " a");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  so.listen = "127.0.0.1:0";
  so.tls = {dir.Join("certs/coordinator.key"), dir.Join("certs/coordinator.pem"), ""};
  auto swapped = GrpcServer::Start(&sync, so);
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(swapped.status().message()), HasSubstr("swapped files?"));
  so.tls = {dir.Join("certs/coordinator.pem"), dir.Join("certs/a.key"), ""};
  auto mismatched = GrpcServer::Start(&sync, so);
  EXPECT_THAT(std::string(mismatched.status().message()), HasSubstr("is not the key of"));
  so.tls = {dir.Join("certs/missing.pem"), dir.Join("certs/a.key"), ""};
  EXPECT_EQ(GrpcServer::Start(&sync, so).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl
