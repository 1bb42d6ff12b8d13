// A hostile peer against a real coordinator process, through its gRPC server: every attack the
// hostile-peer review found is refused with a canonical status, the coordinator's memory and
// threads stay bounded, the global state stays byte for byte what it was, and the process lives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "atoll/v1/outer.grpc.pb.h"
#include "compression/checksum.h"
#include "outer/payload.h"
#include "src/config/config.h"
#include "src/service/coordinator.h"
#include "src/store/flat_params.h"
#include "tests/test_util.h"

namespace atl {
namespace {

namespace pb = ::atollpb::v1;
using ::testing::HasSubstr;

constexpr char kToken[] = "hostile-test-token";

class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(dir_.Join("text.txt"), testing::GeneratedText(20000, 3));
    testing::WriteFile(dir_.Join("run.toml"),
                       "[model]\nn_layer = 2\nd_model = 32\nn_head = 2\ncontext = 32\n"
                       "[data]\npath = \"" + dir_.Join("text.txt") + "\"\nval_fraction = 0.1\n"
                       "[train]\nsteps = 1000\nbatch_size = 2\n"
                       "[outer]\nislands = 2\nsync_every = 10\nlease_s = 60\n"
                       "stream_idle_timeout_s = 1\nmax_pending_calls = 40\nmax_calls_per_island = 4\n");
    auto config = LoadConfig(dir_.Join("run.toml"), {});
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    setenv("ATOLL_TOKEN", kToken, 1);
    coordinator_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{ATOLL_BIN, "coordinator", "--config", dir_.Join("run.toml"),
                                 "--listen", "127.0.0.1:0", "--run-dir", dir_.Join("coord")},
        dir_.Join("coordinator.log"));
    const std::string log = coordinator_->WaitForOutput("listening on", 60);
    const auto at = log.find("listening on ");
    ASSERT_NE(at, std::string::npos) << log;
    address_ = log.substr(at + 13, log.find(' ', at + 13) - at - 13);
    channel_ = NewChannel(0);
    coordinator_stub_ = pb::Coordinator::NewStub(channel_);
    sync_stub_ = pb::OuterSync::NewStub(channel_);
  }
  void TearDown() override { unsetenv("ATOLL_TOKEN"); }

  // Each index is its own TCP connection.
  std::shared_ptr<grpc::Channel> NewChannel(int index) {
    grpc::ChannelArguments args;
    args.SetInt("atoll.test.connection", index);
    args.SetMaxSendMessageSize(64 << 20);
    return grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  }
  static void Prepare(grpc::ClientContext* ctx, double timeout_s = 10) {
    ctx->AddMetadata("authorization", std::string("Bearer ") + kToken);
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  }
  grpc::Status Join(const std::string& name, pb::JoinResponse* out) {
    pb::JoinRequest j;
    j.set_run_id(config_.outer.run_id);
    j.set_name(name);
    j.set_config_hash(ModelConfigHash(config_.model));
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return coordinator_stub_->Join(&ctx, j, out);
  }
  // The global parameters as the service streams them to a member.
  std::string GlobalBytes(const pb::JoinResponse& member) {
    pb::FetchStateRequest f;
    f.set_run_id(config_.outer.run_id);
    f.set_island_id(member.island_id());
    f.set_session(member.session());
    grpc::ClientContext ctx;
    Prepare(&ctx);
    auto reader = sync_stub_->FetchState(&ctx, f);
    std::string bytes;
    pb::StateChunk c;
    while (reader->Read(&c)) bytes += c.chunk().data();
    EXPECT_TRUE(reader->Finish().ok());
    return bytes;
  }
  // Sends the messages of one push; returns the service's answer.
  grpc::Status Push(const std::vector<pb::PushRequest>& messages, grpc::Channel* channel = nullptr) {
    auto stub = pb::OuterSync::NewStub(channel ? channel->shared_from_this() : channel_);
    grpc::ClientContext ctx;
    Prepare(&ctx, 30);
    pb::PushResponse response;
    auto writer = stub->Push(&ctx, &response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  std::vector<pb::PushRequest> Contribution(const pb::JoinResponse& from, const std::string& as,
                                            float value) {
    const uint64_t n = fragment_elements();
    std::vector<float> delta(n, value);
    auto chunks = *outer::EncodeChunks({config_.outer.run_id, as, 0, 0}, {}, delta.data(), 0, n, n);
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(100);
    }
    out[0].set_session(from.session());
    return out;
  }
  uint64_t fragment_elements() const {
    return uint64_t(inner::ParameterCount(config_.model));
  }

  testing::TempDir dir_;
  Config config_;
  std::unique_ptr<testing::ChildProcess> coordinator_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Coordinator::Stub> coordinator_stub_;
  std::unique_ptr<pb::OuterSync::Stub> sync_stub_;
};

TEST_F(HostileClientTest, EveryAttackIsRefusedBoundedAndChangesNothing) {
  pb::JoinResponse honest, mallory;
  ASSERT_TRUE(Join("honest", &honest).ok());
  ASSERT_TRUE(Join("mallory", &mallory).ok());
  const std::string before = GlobalBytes(honest);
  ASSERT_EQ(before.size(), 4 * fragment_elements());
  const int64_t rss0 = coordinator_->PeakRssBytes();

  // Huge finite values (3e38 everywhere) from a member: refused, not averaged into the state.
  auto huge = Push(Contribution(mallory, "mallory", 3e38f));
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << huge.error_message();
  EXPECT_THAT(huge.error_message(), HasSubstr("outer.max_update_value"));

  // Unbounded pushes: 60 messages of 3.9 MiB whose headers claim 1 element, from a non-member
  // and from a member; and one message beyond the 4 MiB limit. Each is refused at its first
  // message; nothing is buffered.
  std::vector<pb::PushRequest> flood(60);
  for (size_t i = 0; i < flood.size(); ++i) {
    auto& m = flood[i];
    auto* h = m.mutable_chunk()->mutable_header();
    h->set_chunk_index(uint32_t(i));
    h->set_num_chunks(60);
    h->set_run_id(config_.outer.run_id);
    h->set_island_id("zed");
    h->set_num_elements(1);
    h->set_fragment_elements(fragment_elements());
    h->set_codec(pb::CODEC_FP32);
    m.mutable_chunk()->set_data(std::string(3900 << 10, 'x'));
  }
  auto stranger = Push(flood);
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::PERMISSION_DENIED) << stranger.error_message();
  for (auto& m : flood) m.mutable_chunk()->mutable_header()->set_island_id("mallory");
  flood[0].set_session(mallory.session());
  auto member = Push(flood);
  EXPECT_EQ(member.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << member.error_message();
  EXPECT_THAT(member.error_message(), HasSubstr("1 elements need 4 bytes"));
  flood.resize(1);
  flood[0].mutable_chunk()->set_data(std::string(6 << 20, 'x'));
  EXPECT_EQ(Push(flood).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // An overlapping or repeated chunk inside one payload, and chunks out of order.
  auto repeated = Contribution(mallory, "mallory", 1e-3f);
  ASSERT_GE(repeated.size(), 1u);
  repeated.push_back(repeated.back());
  auto dup = Push(repeated);
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << dup.error_message();
  EXPECT_THAT(dup.error_message(), HasSubstr("after the last chunk"));

  // Forged names: newlines that would forge log lines, NUL, 1 MiB; and 5 MiB (past the limit).
  pb::JoinResponse ignored;
  for (const std::string& name :
       {std::string("x\nround 99/30 committed: all, params 0"), std::string("nul\0name", 8),
        std::string(1 << 20, 'n')}) {
    auto s = Join(name, &ignored);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_LT(s.error_message().size(), 400u);
  }
  EXPECT_EQ(Join(std::string(5 << 20, 'n'), &ignored).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Impersonation: mallory, holding the run token and her own session, acts as honest.
  {
    pb::HeartbeatRequest beat;
    beat.set_run_id(config_.outer.run_id);
    beat.set_island_id("honest");
    beat.set_session(mallory.session());
    pb::HeartbeatResponse r;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    EXPECT_EQ(coordinator_stub_->Heartbeat(&ctx, beat, &r).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    pb::LeaveRequest leave;
    leave.set_run_id(config_.outer.run_id);
    leave.set_island_id("honest");
    leave.set_session(mallory.session());
    pb::LeaveResponse lr;
    grpc::ClientContext ctx2;
    Prepare(&ctx2);
    EXPECT_EQ(coordinator_stub_->Leave(&ctx2, leave, &lr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Push(Contribution(mallory, "honest", 1e-3f)).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  // Idle streams: 400 push streams over 10 connections that never send. The coordinator's threads
  // stay bounded by its call limits; every stream ends (refused or cancelled after 1 s of
  // silence); a member's heartbeat is answered meanwhile: the flood takes no member's place.
  const int threads0 = coordinator_->Threads();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<pb::OuterSync::Stub>> stubs;
  for (int c = 0; c < 10; ++c) {
    channels.push_back(NewChannel(c + 1));
    stubs.push_back(pb::OuterSync::NewStub(channels.back()));
  }
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::PushRequest>>> idle;
  std::vector<pb::PushResponse> responses(400);
  for (int i = 0; i < 400; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    Prepare(contexts.back().get(), 60);
    idle.push_back(stubs[size_t(i % 10)]->Push(contexts.back().get(), &responses[size_t(i)]));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int threads_peak = coordinator_->Threads();
  {
    pb::HeartbeatRequest beat;
    beat.set_run_id(config_.outer.run_id);
    beat.set_island_id("honest");
    beat.set_session(honest.session());
    pb::HeartbeatResponse r;
    grpc::ClientContext ctx;
    Prepare(&ctx, 5);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(coordinator_stub_->Heartbeat(&ctx, beat, &r).ok());
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  }
  int ended = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& w : idle) {
    const auto s = w->Finish();
    ended += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
             s.error_code() == grpc::StatusCode::CANCELLED;
  }
  EXPECT_EQ(ended, 400);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15.0);
  EXPECT_LT(threads_peak, threads0 + 40 + 40) << "threads before " << threads0;

  // 600 join/leave cycles under distinct 64-character names: remembered in bounded space.
  for (int i = 0; i < 600; ++i) {
    std::string name = "cycle" + std::to_string(i);
    name.resize(64, 'x');
    pb::JoinResponse j;
    ASSERT_TRUE(Join(name, &j).ok() || true);
    if (j.session().empty()) continue;
    pb::LeaveRequest leave;
    leave.set_run_id(config_.outer.run_id);
    leave.set_island_id(name);
    leave.set_session(j.session());
    pb::LeaveResponse lr;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    coordinator_stub_->Leave(&ctx, leave, &lr);
  }

  // Alive, state untouched, memory bounded.
  EXPECT_TRUE(coordinator_->Alive());
  const int64_t growth = coordinator_->PeakRssBytes() - rss0;
  std::printf("coordinator peak RSS grew by %.1f MiB; threads %d -> %d at the peak of 400 idle "
              "streams\n", double(growth) / (1 << 20), threads0, threads_peak);
  EXPECT_LT(growth, int64_t(96) << 20);
  EXPECT_EQ(GlobalBytes(honest), before);
  const std::string log = testing::ReadFile(dir_.Join("coordinator.log"));
  EXPECT_EQ(log.find("round 99/30"), std::string::npos) << log;
  EXPECT_EQ(coordinator_->Terminate(), 0);
  auto state = ReadServiceState(dir_.Join("coord/service-state.pb"));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->fragments(0).round(), 0u);
  EXPECT_EQ(state->fragments(0).params(), before);
}

}  // namespace
}  // namespace atl
