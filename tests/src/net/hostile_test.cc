// A hostile peer against a real coordinator process, through its gRPC server: every attack the
// hostile-peer review found is refused with a canonical status, the coordinator's memory and
// threads stay bounded, the global state stays byte for byte what it was, and the process lives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "atoll/v1/outer.grpc.pb.h"
#include "compression/checksum.h"
#include "outer/base/payload.h"
#include "outer/service/sync_server.h"
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
                       "stream_idle_timeout_s = 1\nmax_pending_calls = 40\nmax_calls_per_island = 4\n" +
                           OuterExtra());
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
  // More [outer] keys for a fixture of its own.
  virtual std::string OuterExtra() const { return ""; }

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
  grpc::Status Leave(const pb::JoinResponse& member) {
    pb::LeaveRequest l;
    l.set_run_id(config_.outer.run_id);
    l.set_island_id(member.island_id());
    l.set_session(member.session());
    pb::LeaveResponse r;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return coordinator_stub_->Leave(&ctx, l, &r);
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
                                            float value, uint64_t tokens = 100) {
    const uint64_t n = fragment_elements();
    std::vector<float> delta(n, value);
    auto chunks = *outer::EncodeChunks({config_.outer.run_id, as, 0, 0}, {}, delta.data(), 0, n, n);
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(tokens);
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

// The attacks of EveryAttackIsRefusedBoundedAndChangesNothing, step by step.
class HostileAttackTest : public HostileClientTest {
 protected:
  // Payloads a member or a stranger pushes: each refused with its status, nothing kept.
  void ExpectPayloadAttacksRefused(const pb::JoinResponse& mallory) {
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
  }

  // Forged names: newlines that would forge log lines, NUL, 1 MiB; and 5 MiB (past the limit).
  void ExpectForgedNamesRefused() {
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
  }

  // Impersonation: mallory, holding the run token and her own session, acts as honest.
  void ExpectImpersonationRefused(const pb::JoinResponse& honest, const pb::JoinResponse& mallory) {
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
  }

  // Idle streams: 400 push streams over 10 connections that never send. The coordinator's threads
  // stay bounded by its call limits; every stream ends (refused or cancelled after 1 s of
  // silence); a member's heartbeat is answered meanwhile: the flood takes no member's place.
  // Returns the coordinator's threads before the flood and at its peak.
  std::pair<int, int> ExpectIdleStreamsBounded(const pb::JoinResponse& honest) {
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
    return {threads0, threads_peak};
  }

  // 600 join/leave cycles under distinct 64-character names: remembered in bounded space.
  void CycleNames() {
    for (int i = 0; i < 600; ++i) {
      std::string name = "cycle" + std::to_string(i);
      name.resize(64, 'x');
      pb::JoinResponse j;
      if (Join(name, &j).ok()) Leave(j);
    }
  }
};

TEST_F(HostileAttackTest, EveryAttackIsRefusedBoundedAndChangesNothing) {
  pb::JoinResponse honest, mallory;
  ASSERT_TRUE(Join("honest", &honest).ok());
  ASSERT_TRUE(Join("mallory", &mallory).ok());
  const std::string before = GlobalBytes(honest);
  ASSERT_EQ(before.size(), 4 * fragment_elements());
  const int64_t rss0 = coordinator_->PeakRssBytes();

  ExpectPayloadAttacksRefused(mallory);
  ExpectForgedNamesRefused();
  ExpectImpersonationRefused(honest, mallory);
  const auto [threads0, threads_peak] = ExpectIdleStreamsBounded(honest);
  CycleNames();

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

// Ranges in requests (issue 36, gap 3): an offset near 2^64, a count that wraps past it, or a range
// past the fragment's end is refused OUT_OF_RANGE at once by AwaitUpdate and FetchState alike; a
// range inside the fragment is still served.
TEST_F(HostileClientTest, WrappedAndOutOfRangeRangesAreRefusedAlike) {
  pb::JoinResponse member;
  ASSERT_TRUE(Join("ranges", &member).ok());
  const uint64_t n = fragment_elements();
  struct Range { uint64_t offset, count; };
  const std::vector<Range> bad = {
      {UINT64_MAX - 4, 10}, {0, UINT64_MAX}, {1, UINT64_MAX}, {n + 1, 0}, {n - 1, 2}, {n, 1}};
  for (const Range& r : bad) {
    SCOPED_TRACE(::testing::Message() << "offset " << r.offset << " count " << r.count);
    pb::UpdateRequest u;
    u.set_run_id(config_.outer.run_id);
    u.set_island_id(member.island_id());
    u.set_session(member.session());
    u.set_round(0);
    u.set_offset(r.offset);
    u.set_num_elements(r.count);
    grpc::ClientContext uctx;
    Prepare(&uctx, 5);
    const auto t0 = std::chrono::steady_clock::now();
    auto updates = sync_stub_->AwaitUpdate(&uctx, u);
    pb::UpdateChunk chunk;
    int chunks = 0;
    while (updates->Read(&chunk)) ++chunks;
    const auto us = updates->Finish();
    EXPECT_EQ(us.error_code(), grpc::StatusCode::OUT_OF_RANGE) << us.error_message();
    EXPECT_EQ(chunks, 0);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);

    pb::FetchStateRequest f;
    f.set_run_id(config_.outer.run_id);
    f.set_island_id(member.island_id());
    f.set_session(member.session());
    f.set_offset(r.offset);
    f.set_num_elements(r.count);
    grpc::ClientContext fctx;
    Prepare(&fctx, 5);
    auto state = sync_stub_->FetchState(&fctx, f);
    pb::StateChunk piece;
    chunks = 0;
    while (state->Read(&piece)) ++chunks;
    const auto fs = state->Finish();
    EXPECT_EQ(fs.error_code(), grpc::StatusCode::OUT_OF_RANGE) << fs.error_message();
    EXPECT_EQ(chunks, 0);
    // One code, one message shape for both.
    EXPECT_EQ(us.error_message(), fs.error_message());
  }
  // A range inside the fragment (its last element) is served.
  pb::FetchStateRequest f;
  f.set_run_id(config_.outer.run_id);
  f.set_island_id(member.island_id());
  f.set_session(member.session());
  f.set_offset(n - 1);
  f.set_num_elements(1);
  grpc::ClientContext ctx;
  Prepare(&ctx, 5);
  auto state = sync_stub_->FetchState(&ctx, f);
  std::string bytes;
  pb::StateChunk piece;
  while (state->Read(&piece)) bytes += piece.chunk().data();
  EXPECT_TRUE(state->Finish().ok());
  EXPECT_EQ(bytes, GlobalBytes(member).substr(4 * (n - 1)));
  EXPECT_TRUE(coordinator_->Alive());
}

// Idle anonymous push streams (any holder of the run token can open them) never make a member
// wait: 80 streams over 4 connections, each reopened as soon as it ends, while an island leaves
// and comes back (join, state download, heartbeat) three times; then a first-time join.
TEST_F(HostileClientTest, IdleStreamsDoNotStarveJoinsOrStateQueries) {
  pb::JoinResponse honest, mallory;
  ASSERT_TRUE(Join("honest", &honest).ok());
  ASSERT_TRUE(Join("mallory", &mallory).ok());
  // What an island coming back does; its time.
  auto come_back = [&](pb::JoinResponse* member) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(Leave(*member).ok());
    const auto joined = Join(member->island_id(), member);
    EXPECT_TRUE(joined.ok()) << joined.error_message();
    EXPECT_EQ(GlobalBytes(*member).size(), 4 * fragment_elements());
    pb::HeartbeatRequest beat;
    beat.set_run_id(config_.outer.run_id);
    beat.set_island_id(member->island_id());
    beat.set_session(member->session());
    pb::HeartbeatResponse r;
    grpc::ClientContext ctx;
    Prepare(&ctx, 5);
    const auto beaten = coordinator_stub_->Heartbeat(&ctx, beat, &r);
    EXPECT_TRUE(beaten.ok()) << beaten.error_message();
    // The run's state, as a status page or an operator asks for it, from the flood's address.
    pb::GetStateRequest query;
    query.set_run_id(config_.outer.run_id);
    pb::GetStateResponse state;
    grpc::ClientContext query_ctx;
    Prepare(&query_ctx, 5);
    const auto queried = coordinator_stub_->GetState(&query_ctx, query, &state);
    EXPECT_TRUE(queried.ok()) << queried.error_message();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double usual_s = come_back(&honest);

  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < 4; ++c) channels.push_back(NewChannel(c + 1));
  std::vector<std::thread> flood;
  for (int i = 0; i < 80; ++i) {
    flood.emplace_back([&, i] {
      auto stub = pb::OuterSync::NewStub(channels[size_t(i % 4)]);
      while (!stop.load()) {
        grpc::ClientContext ctx;
        Prepare(&ctx, 30);
        pb::PushResponse response;
        auto writer = stub->Push(&ctx, &response);
        ++opened;
        if (writer->Finish().error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // every place they can take
  double worst_s = 0;
  for (int k = 0; k < 3; ++k) worst_s = std::max(worst_s, come_back(&honest));
  pb::JoinResponse newcomer;
  ASSERT_TRUE(Leave(mallory).ok());
  const auto first = Join("newcomer", &newcomer);
  EXPECT_TRUE(first.ok()) << first.error_message();
  stop = true;
  for (auto& t : flood) t.join();
  std::printf("an island comes back in %.3f s alone, at worst %.3f s beside %d idle streams\n",
              usual_s, worst_s, opened.load());
  EXPECT_GT(opened.load(), 80);
  EXPECT_LT(worst_s, std::max(1.0, 5 * usual_s));
  EXPECT_TRUE(coordinator_->Alive());
}

// Join/leave churn (a member that leaves and rejoins thousands of times, and peers with a new name
// each time) writes a bounded log: a few lines per island and kind, a few per minute in all.
TEST_F(HostileClientTest, ChurnWritesABoundedLog) {
  pb::JoinResponse honest, mallory;
  ASSERT_TRUE(Join("honest", &honest).ok());
  ASSERT_TRUE(Join("mallory", &mallory).ok());
  // Joins are logged once the run has started: complete round 0.
  ASSERT_TRUE(Push(Contribution(honest, "honest", 1e-3f)).ok());
  ASSERT_TRUE(Push(Contribution(mallory, "mallory", 1e-3f)).ok());
  coordinator_->WaitForOutput("committed (1/", 10);
  auto log_size = [this] { return testing::ReadFile(dir_.Join("coordinator.log")).size(); };
  const size_t before = log_size();
  constexpr int kCycles = 2000;
  for (int i = 0; i < kCycles; ++i) {
    ASSERT_TRUE(Leave(mallory).ok());
    ASSERT_TRUE(Join("mallory", &mallory).ok()) << i;
  }
  ASSERT_TRUE(Leave(mallory).ok());
  for (int i = 0; i < kCycles; ++i) {
    pb::JoinResponse churn;
    ASSERT_TRUE(Join(absl::StrCat("churn", i), &churn).ok()) << i;
    ASSERT_TRUE(Leave(churn).ok());
  }
  const std::string log = testing::ReadFile(dir_.Join("coordinator.log"));
  const size_t grown = log.size() - before;
  // Unbounded, 8,000 lines of ~80 bytes (640 kB); here at most the window's 100 lines.
  EXPECT_LT(grown, 16000u) << log.substr(before, 4000);
  EXPECT_THAT(log, HasSubstr("island 'mallory' left at round 1"));
  EXPECT_THAT(log, HasSubstr("island 'mallory' joined at round 1"));
  EXPECT_TRUE(coordinator_->Alive());
}

// A member that declares 16 data-parallel ranks may claim 16 x the round's tokens (the bound per
// round follows the declared ranks), but its own heartbeats report what one rank trains: its
// claims are flagged, by name, in the log and on the status API; an honest island's are not.
TEST_F(HostileClientTest, ClaimsAboveTheReportedThroughputAreFlagged) {
  pb::JoinResponse honest, mallory;
  ASSERT_TRUE(Join("honest", &honest).ok());
  pb::JoinRequest wide;
  wide.set_run_id(config_.outer.run_id);
  wide.set_name("mallory");
  wide.set_config_hash(ModelConfigHash(config_.model));
  wide.set_data_parallel(16);
  {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    ASSERT_TRUE(coordinator_stub_->Join(&ctx, wide, &mallory).ok());
  }
  auto beat = [&](const pb::JoinResponse& m, double tokens_per_s) {
    pb::HeartbeatRequest b;
    b.set_run_id(config_.outer.run_id);
    b.set_island_id(m.island_id());
    b.set_session(m.session());
    b.mutable_telemetry()->set_tokens_per_s(tokens_per_s);
    pb::HeartbeatResponse r;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    EXPECT_TRUE(coordinator_stub_->Heartbeat(&ctx, b, &r).ok());
  };
  // Honest: 640 tokens (a round of H = 10 steps of 64) at 1e8 tokens/s takes 6.4 us, less than
  // the calls here do. Mallory: 16 x 640 tokens at the 100 tokens/s she reports would take 102 s.
  beat(honest, 1e8);
  beat(mallory, 100);
  // A first contribution may hold work from before the join (a rejoin): the flag counts from it.
  const uint64_t round = 10 * config_.tokens_per_rank_step();
  const std::string before = GlobalBytes(honest);
  ASSERT_TRUE(Push(Contribution(honest, "honest", 1e-3f, round)).ok());
  ASSERT_TRUE(Push(Contribution(mallory, "mallory", 1e-3f, 16 * round)).ok());
  for (int i = 0; i < 200 && GlobalBytes(honest) == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(GlobalBytes(honest), before) << "round 0 did not commit";
  auto second = [&](const pb::JoinResponse& m, const std::string& name, uint64_t tokens) {
    auto c = Contribution(m, name, 1e-3f, tokens);
    for (auto& message : c) message.mutable_chunk()->mutable_header()->set_round(1);
    return Push(c);
  };
  // Claims are judged over at least Rounds::kClaimMinWindowS: mallory's second round comes later.
  std::this_thread::sleep_for(std::chrono::duration<double>(outer::SyncServer::kClaimMinWindowS + 0.1));
  ASSERT_TRUE(second(honest, "honest", round).ok());
  const auto greedy = second(mallory, "mallory", 16 * round);
  ASSERT_TRUE(greedy.ok()) << greedy.error_message();  // within the declared ranks' bound
  std::string log;
  for (int i = 0; i < 400; ++i) {  // up to 20 s: the log is a child's, slower under load
    log = testing::ReadFile(dir_.Join("coordinator.log"));
    if (log.find("island 'mallory' claims more tokens") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(log, HasSubstr("island 'mallory' claims more tokens than its throughput allows: "
                             "10240 tokens in "));
  EXPECT_THAT(log, HasSubstr("its declared data-parallel ranks (16) may be false"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("island 'honest' claims more tokens")));
  EXPECT_TRUE(coordinator_->Alive());
}

// A run that starts with a warm start: its first rounds are one inner step each.
class WarmStartHostileTest : public HostileClientTest {
 protected:
  std::string OuterExtra() const override { return "warm_start_steps = 5\n"; }
};

// A member claiming far more tokens than its round trained (100 x a warm-start round's one step,
// or a whole H, which the run-wide bound used to let through) would set the average's direction
// alone under the token-weighted mean: refused by name, nothing changes; the true weight is taken.
TEST_F(WarmStartHostileTest, TokenClaimsBeyondTheRoundAreRefused) {
  pb::JoinResponse honest, mallory;
  ASSERT_TRUE(Join("honest", &honest).ok());
  ASSERT_TRUE(Join("mallory", &mallory).ok());
  const std::string before = GlobalBytes(honest);
  const uint64_t step = config_.tokens_per_rank_step();  // 2 x 32
  ASSERT_EQ(step, 64u);
  for (const uint64_t claim : {100 * step, 10 * step, 2 * step}) {
    auto greedy = Push(Contribution(mallory, "mallory", -1e-3f, claim));
    EXPECT_EQ(greedy.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << greedy.error_message();
    EXPECT_THAT(greedy.error_message(),
                HasSubstr(absl::StrCat("claims ", claim, " tokens; it covers at most 1 inner steps "
                                       "of 64 tokens on each of the island's 1 data-parallel "
                                       "ranks: 64")));
  }
  EXPECT_EQ(GlobalBytes(honest), before);
  // One step's tokens from each: the round commits (the global state moves).
  ASSERT_TRUE(Push(Contribution(honest, "honest", 1e-3f, step)).ok());
  ASSERT_TRUE(Push(Contribution(mallory, "mallory", 1e-3f, step)).ok());
  for (int i = 0; i < 100 && GlobalBytes(honest) == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(GlobalBytes(honest), before);
  // Round 1 is one step too, and mallory has contributed since she joined: no slack.
  auto again = Contribution(mallory, "mallory", 1e-3f, 2 * step);
  for (auto& m : again) m.mutable_chunk()->mutable_header()->set_round(1);
  auto s = Push(again);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // An island may declare its data-parallel ranks (its weight per step), within a bound.
  pb::JoinRequest wide;
  wide.set_run_id(config_.outer.run_id);
  wide.set_name("wide");
  wide.set_config_hash(ModelConfigHash(config_.model));
  wide.set_data_parallel(outer::SyncServer::kMaxDataParallel + 1);
  pb::JoinResponse ignored;
  grpc::ClientContext ctx;
  Prepare(&ctx);
  const auto refused = coordinator_stub_->Join(&ctx, wide, &ignored);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("data-parallel ranks"));
  EXPECT_TRUE(coordinator_->Alive());
}

}  // namespace
}  // namespace atl
