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
#include "outer/aggregation.h"
#include "outer/faulty_transport.h"
#include "outer/in_process_transport.h"
#include "outer/island_sync.h"
#include "outer/outer_optimizer.h"
#include "outer/payload.h"
#include "outer/sync_server.h"
#include "tests/test_util.h"

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
