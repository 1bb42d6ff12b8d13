// The fixture of the sync service's tests (outer_test.cc, sync_codecs_test.cc,
// sync_recovery_test.cc): a service over a small layout, islands that join it and push.
#ifndef ATOLL_TESTS_OUTER_SYNC_SERVER_FIXTURE_H_
#define ATOLL_TESTS_OUTER_SYNC_SERVER_FIXTURE_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "outer/base/aggregation.h"
#include "outer/base/faulty_transport.h"
#include "outer/service/in_process_transport.h"
#include "outer/island/island_sync.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/payload.h"
#include "outer/service/sync_server.h"
#include "tests/files_util.h"
#include "tests/transport_util.h"

namespace atl::outer {

using ::testing::HasSubstr;

class SyncServerTest : public ::testing::Test {
 protected:
  SyncServerTest() {
    options_.run_id = "run";
    options_.optimizer = {1.0, 0.0, false};
    options_.num_data_streams = 3;
    layout_.names = {"w"};
    layout_.numels = {4};
  }
  std::unique_ptr<SyncServer> Make(std::vector<float> init = {1, 2, 3, 4}) {
    return std::make_unique<SyncServer>(options_, layout_, std::move(init));
  }
  // A service restarted from `s`'s durable state as its state file would carry it (the state
  // written into *state when given); a failure to write or restore it fails the test.
  std::unique_ptr<SyncServer> Resumed(SyncServer& s, std::vector<float> init,
                                      pb::ServiceState* state = nullptr) {
    std::map<std::string, std::vector<float>> tensors;
    auto written = s.Snapshot([&](uint32_t, const std::string& t, const float* data, size_t n) {
      tensors[t] = std::vector<float>(data, data + n);
      return absl::OkStatus();
    });
    EXPECT_TRUE(written.ok()) << written.status();
    auto restarted = Make(std::move(init));
    if (!written.ok()) return restarted;
    const absl::Status restored =
        restarted->Restore(*written, [&](uint32_t, const std::string& t, float* out, size_t n) {
          if (tensors[t].size() != n) return absl::DataLossError(t);
          std::copy(tensors[t].begin(), tensors[t].end(), out);
          return absl::OkStatus();
        });
    EXPECT_TRUE(restored.ok()) << restored;
    if (state != nullptr) *state = *std::move(written);
    return restarted;
  }
  // Joins and remembers the island's session credential, which every later call carries.
  std::string Join(SyncServer& s, const std::string& name) {
    pb::JoinRequest r;
    r.set_run_id("run");
    r.set_name(name);
    auto j = s.Join(r);
    EXPECT_TRUE(j.ok()) << j.status();
    if (!j.ok()) return "";
    sessions_[name] = j->session();
    return j->island_id();
  }
  // A fetch of a whole fragment 0 by `island`, with its credential.
  pb::FetchStateRequest Fetch(const std::string& island) {
    pb::FetchStateRequest fetch;
    fetch.set_run_id("run");
    fetch.set_island_id(island);
    fetch.set_session(sessions_[island]);
    return fetch;
  }
  // A service of one 1000-element fragment sent 64 elements per chunk; islands a and b joined.
  std::unique_ptr<SyncServer> ChunkedServiceOfTwo() {
    options_.num_data_streams = 2;
    options_.chunk_bytes = 256;
    layout_.numels = {1000};
    auto s = Make(std::vector<float>(1000, 1.0f));
    Join(*s, "a");
    Join(*s, "b");
    return s;
  }
  std::shared_ptr<const IslandIdentity> Id(const std::string& name) {
    return std::make_shared<IslandIdentity>(name, sessions_[name]);
  }
  std::vector<pb::PushRequest> Payload(const std::string& island, uint64_t round,
                                       std::vector<float> delta, uint64_t tokens = 10) {
    auto chunks = *EncodeChunks({"run", island, round, 0}, {compression::Codec::kFp32, 0},
                                delta.data(), 0, delta.size(), delta.size());
    std::vector<pb::PushRequest> out(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      *out[i].mutable_chunk() = chunks[i];
      out[i].set_tokens(tokens);
    }
    out[0].set_session(sessions_[island]);
    return out;
  }
  // One sync round of two islands (in two threads), each with its own made-up local training.
  static std::pair<absl::StatusOr<RoundOutcome>, absl::StatusOr<RoundOutcome>> SyncBoth(
      IslandSync& a, IslandSync& b, int round) {
    std::vector<float> la = a.global(), lb = b.global();
    for (size_t i = 0; i < la.size(); ++i) {
      la[i] -= 0.01f * std::cos(float(i * (round + 1)));
      lb[i] += 0.003f * float(i % 7);
    }
    absl::StatusOr<RoundOutcome> ra;
    std::thread th([&] { ra = a.SyncRound(la, 100); });
    auto rb = b.SyncRound(lb, 50);
    th.join();
    return {std::move(ra), std::move(rb)};
  }
  // Two islands, Nesterov 0.7 / 0.9, one fragment of 1000 elements (returned: its initial values),
  // which a sharded island's two ranks split as kRank0Ranges and kRank1Ranges.
  std::vector<float> TwoIslandsOf1000() {
    options_.optimizer = {0.7, 0.9, true};
    options_.num_data_streams = 2;
    layout_.numels = {1000};
    return Sines(1000);
  }
  const std::vector<std::pair<uint64_t, uint64_t>> kRank0Ranges = {{0, 300}, {600, 800}},
                                                   kRank1Ranges = {{300, 600}, {800, 1000}};
  // Island a of one rank and island b of two (kRank0Ranges, kRank1Ranges), each over its own
  // faulty view of one transport: calls dropped with probability `faults`, chunks corrupted with
  // a quarter of it. Joins a and b to `s`; the ranks have fetched the global parameters.
  struct ThreeRanks {
    std::unique_ptr<FaultyTransport> fa, fb0, fb1;
    std::unique_ptr<IslandSync> a, b0, b1;
    uint64_t dropped() const { return fa->dropped() + fb0->dropped() + fb1->dropped(); }
    uint64_t corrupted() const { return fa->corrupted() + fb0->corrupted() + fb1->corrupted(); }
  };
  ThreeRanks JoinThreeRanks(SyncServer& s, Transport* transport, double faults,
                            IslandSyncOptions so) {
    ThreeRanks t;
    t.fa = std::make_unique<FaultyTransport>(transport,
                                             Faults{faults, absl::ZeroDuration(), faults / 4});
    t.fb0 = std::make_unique<FaultyTransport>(
        transport, Faults{faults, absl::ZeroDuration(), faults / 4, 0, 1, 2});
    t.fb1 = std::make_unique<FaultyTransport>(
        transport, Faults{faults, absl::ZeroDuration(), faults / 4, 0, 1, 3});
    Join(s, "a");
    Join(s, "b");
    so.retries = 10;
    t.a = std::make_unique<IslandSync>(t.fa.get(), "run", Id("a"), 1000, so);
    so.ranges = kRank0Ranges;
    t.b0 = std::make_unique<IslandSync>(t.fb0.get(), "run", Id("b"), 1000, so);
    so.ranges = kRank1Ranges;
    t.b1 = std::make_unique<IslandSync>(t.fb1.get(), "run", Id("b"), 1000, so);
    EXPECT_TRUE(t.a->FetchGlobal().ok() && t.b0->FetchGlobal().ok() && t.b1->FetchGlobal().ok());
    return t;
  }
  // One round of the three ranks (in three threads), each moved by a made-up local training;
  // a's outcome, or the first error.
  static absl::StatusOr<RoundOutcome> SyncThree(ThreeRanks& t, int round) {
    auto perturbed = [&](const IslandSync& x, float scale) {
      std::vector<float> v = x.global();
      for (size_t i = 0; i < v.size(); ++i) v[i] += scale * std::cos(float(i * (round + 1)));
      return v;
    };
    absl::StatusOr<RoundOutcome> ra, rb0, rb1;
    std::thread ta([&] { ra = t.a->SyncRound(perturbed(*t.a, 0.01f), 100); });
    std::thread tb0([&] { rb0 = t.b0->SyncRound(perturbed(*t.b0, -0.003f), 60); });
    rb1 = t.b1->SyncRound(perturbed(*t.b1, -0.003f), 60);
    ta.join();
    tb0.join();
    for (const auto* r : {&rb0, &rb1}) {
      if (!r->ok()) return r->status();
    }
    return ra;
  }
  static std::vector<float> Sines(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(float(i));
    return v;
  }
  SyncServerOptions options_;
  FragmentLayout layout_;
  std::map<std::string, std::string> sessions_;
};

}  // namespace atl::outer

#endif  // ATOLL_TESTS_OUTER_SYNC_SERVER_FIXTURE_H_
