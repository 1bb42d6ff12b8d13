// The service's commit of one sync round, in process: M islands' pseudo-gradients (random, encoded
// with the run's codec) are pushed, and the time from the last push to the published round (the
// last push runs the commit: aggregation, the outer step, encoding, hashing) is measured with
// 1 and 2 service threads, median of the rounds. Also the aggregation alone, as the rate at which
// contributions are decoded and folded in (fp32 bytes per second, against memcpy on one core).
//
//   build/tests/bench/commit_bench [elements=50000000] [islands=8] [codec=fp4_e2m1] [rounds=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "outer/base/aggregation.h"
#include "outer/service/sync_server.h"

namespace {

using namespace atl;
namespace pb = ::atollpb::v1;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<pb::PushRequest> Requests(const std::vector<pb::Chunk>& chunks, const std::string& session) {
  std::vector<pb::PushRequest> out;
  for (const auto& c : chunks) {
    pb::PushRequest r;
    *r.mutable_chunk() = c;
    r.set_session(session);
    r.set_tokens(1000);
    out.push_back(std::move(r));
  }
  return out;
}

// Median seconds of the commit with `threads` service threads.
double TimeCommits(uint64_t n, int islands, const compression::CodecSpec& codec, int rounds,
                   int threads) {
  outer::SyncServerOptions o;
  o.run_id = "bench";
  o.num_data_streams = uint32_t(islands);
  o.codec = codec;
  o.service_threads = threads;
  std::vector<float> init(n, 0.01f);
  outer::SyncServer sync(o, {{"w"}, {n}}, std::move(init));
  std::vector<std::string> sessions;
  for (int i = 0; i < islands; ++i) {
    pb::JoinRequest j;
    j.set_run_id("bench");
    j.set_name("island" + std::to_string(i));
    sessions.push_back(sync.Join(j)->session());
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(n);
  std::vector<double> times;
  for (int r = 0; r < rounds; ++r) {
    Clock::time_point last;
    for (int i = 0; i < islands; ++i) {
      for (auto& v : g) v = normal(rng);
      const std::string name = "island" + std::to_string(i);
      auto chunks = outer::EncodeChunks({"bench", name, uint64_t(r), 0}, codec, g.data(), 0, n, n);
      auto requests = Requests(*chunks, sessions[size_t(i)]);
      // The last push: from its end (its stream received and checked) to the published round.
      auto stream = sync.OpenPush(requests.front());
      for (auto& q : requests) {
        if (!(*stream)->Add(std::move(q)).ok()) std::abort();
      }
      if (i == islands - 1) last = Clock::now();
      if (!sync.FinishPush(*std::move(stream)).ok()) std::abort();
    }
    times.push_back(Seconds(last));
    if (sync.round() != uint64_t(r + 1)) std::abort();
  }
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 50000000;
  const int islands = argc > 2 ? std::atoi(argv[2]) : 8;
  const auto codec = *compression::ParseCodec(argc > 3 ? argv[3] : "fp4_e2m1");
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 3;
  std::printf("%llu elements, %d islands, %s, median of %d rounds\n", (unsigned long long)n,
              islands, compression::CodecName(codec.codec).c_str(), rounds);
  // The aggregation alone: decode-and-fold of every contribution, one thread.
  {
    std::vector<float> g(n), out(n), copy(n);
    std::mt19937 rng(2);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    for (auto& v : g) v = normal(rng);
    std::vector<outer::EncodedPayload> payloads{size_t(islands)};
    std::vector<outer::ContributionRef> refs;
    for (int i = 0; i < islands; ++i) {
      auto chunks = *outer::EncodeChunks({"bench", "", 0, 0}, codec, g.data(), 0, n, n);
      payloads[size_t(i)].codec = codec;
      for (auto& c : chunks) {
        payloads[size_t(i)].chunks.push_back(
            {c.header().offset(), c.header().num_elements(), std::move(*c.mutable_data())});
      }
      payloads[size_t(i)].elements = n;
      refs.push_back({"island" + std::to_string(i), 1000, 1.0, &payloads[size_t(i)]});
    }
    auto t0 = Clock::now();
    std::memcpy(copy.data(), g.data(), n * 4);
    const double memcpy_s = Seconds(t0);
    t0 = Clock::now();
    if (!outer::Aggregate({}, refs, n, out.data(), nullptr).ok()) std::abort();
    const double agg_s = Seconds(t0);
    const double rate = double(n) * 4 * islands / agg_s / 1e9;
    std::printf("aggregation (decode and fold, one thread): %.2f GB/s of fp32 contributions = "
                "%.0f%% of memcpy (%.2f GB/s)\n",
                rate, 100 * rate / (double(n) * 4 / memcpy_s / 1e9), double(n) * 4 / memcpy_s / 1e9);
  }
  const double one = TimeCommits(n, islands, codec, rounds, 1);
  const double two = TimeCommits(n, islands, codec, rounds, 2);
  std::printf("commit, 1 service thread:  %.3f s\n", one);
  std::printf("commit, 2 service threads: %.3f s (%.2fx faster)\n", two, one / two);
  return 0;
}
