// The service's commit of one sync round, in process: M islands' pseudo-gradients (random, encoded
// with the run's codec) are pushed, and the time from the last push to the published round (the
// last push runs the commit: aggregation, the outer step, encoding, hashing) is measured with
// 1 and 2 service threads, median of the rounds. Also the aggregation alone, as the rate at which
// contributions are decoded and folded in (fp32 bytes per second, against memcpy on one core).
// With a density (top-k per chunk of 4096, as outer.topk_density) the contributions are sparse;
// with the optimizer sgd the outer step is linear (the sparse commit).
//
//   build/tests/bench/commit_bench [elements=50000000] [islands=8] [codec=fp4_e2m1] [rounds=3]
//       [density=0: dense] [optimizer=nesterov]
// With rounds 0, the parts alone (aggregation, and the sparse step with sgd).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "outer/base/aggregation.h"
#include "outer/base/decoded_kept.h"
#include "outer/base/fragment_data.h"
#include "outer/service/sync_server.h"

namespace {

using namespace atl;
namespace pb = ::atollpb::v1;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Pseudo-gradients: the sum of two uniforms in [-1e-3, 1e-3) (a cheap bell), from splitmix64.
void Fill(std::vector<float>& g, uint64_t seed) {
  auto next = [&seed] {
    uint64_t z = (seed += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (auto& v : g) {
    const uint64_t r = next();
    v = (float(uint32_t(r) >> 8) + float(uint32_t(r >> 32) >> 8)) * (1e-3f / 16777216.0f) - 1e-3f;
  }
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

// Median seconds of the commit with `threads` service threads. With `hold`, the bench keeps every
// committed round (as an island still reading it would), so no commit reuses a retired round's
// update buffers.
double TimeCommits(uint64_t n, int islands, const compression::CodecSpec& codec, int rounds,
                   int threads, const std::string& optimizer, bool hold = false) {
  outer::SyncServerOptions o;
  o.run_id = "bench";
  o.num_data_streams = uint32_t(islands);
  o.codec = codec;
  o.optimizer.name = optimizer;
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
  std::vector<float> g(n);
  std::vector<double> times;
  std::vector<std::shared_ptr<const outer::CommittedRound>> held;
  for (int r = 0; r < rounds; ++r) {
    Clock::time_point last;
    for (int i = 0; i < islands; ++i) {
      Fill(g, uint64_t(r * islands + i));
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
    if (hold) held.push_back(*sync.AwaitRound(uint64_t(r), absl::Now(), 0));
  }
  return Median(times);
}

// The fastest of three runs of `run`, in seconds.
template <typename Run>
double Fastest(Run&& run) {
  double best = 1e9;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    run(r);
    best = std::min(best, Seconds(t0));
  }
  return best;
}

// Each island's pseudo-gradient, encoded with the codec, as the service holds it.
struct Contributions {
  std::vector<outer::EncodedPayload> payloads;
  std::vector<outer::ContributionRef> refs;
};
Contributions MakeContributions(uint64_t n, int islands, const compression::CodecSpec& codec,
                                std::vector<float>& g) {
  Contributions c;
  c.payloads.resize(size_t(islands));
  for (int i = 0; i < islands; ++i) {
    Fill(g, uint64_t(1000 + i));
    auto chunks = *outer::EncodeChunks({"bench", "", 0, 0}, codec, g.data(), 0, n, n);
    outer::EncodedPayload& p = c.payloads[size_t(i)];
    p.codec = codec;
    for (auto& chunk : chunks) {
      p.chunks.push_back({chunk.header().offset(), chunk.header().num_elements(),
                          std::move(*chunk.mutable_data())});
    }
    p.elements = n;
    c.refs.push_back({"island" + std::to_string(i), 1000, 1.0, &p});
  }
  return c;
}

// The dense fold of every contribution, one thread, against memcpy. Returns its seconds.
double TimeDenseAggregation(const Contributions& in, uint64_t n, const std::vector<float>& g) {
  std::vector<float> out(n), copy(n);
  auto t0 = Clock::now();
  std::memcpy(copy.data(), g.data(), n * 4);
  const double memcpy_s = Seconds(t0);
  t0 = Clock::now();
  if (!outer::Aggregate({}, in.refs, n, out.data(), nullptr).ok()) std::abort();
  const double agg_s = Seconds(t0);
  const double rate = double(n) * 4 * double(in.refs.size()) / agg_s / 1e9;
  std::printf("aggregation (decode and fold, one thread): %.2f GB/s of fp32 contributions = "
              "%.0f%% of memcpy (%.2f GB/s)\n",
              rate, 100 * rate / (double(n) * 4 / memcpy_s / 1e9), double(n) * 4 / memcpy_s / 1e9);
  return agg_s;
}

// The sparse fold from the encoded bytes, then as the service folds them: each contribution's
// kept values decoded once when its push is checked (MeasureAndKeep, off the commit's path but
// for the last push). Leaves the outer gradient in *sparse.
void TimeSparseAggregation(Contributions& in, uint64_t n, const compression::CodecSpec& codec,
                           double dense_s, outer::SparseGradient* sparse) {
  auto fold = [&](int) {
    if (!outer::AggregateSparse({}, in.refs, n, nullptr, sparse).ok()) std::abort();
  };
  const double sparse_s = Fastest(fold);
  const double kept_values = double(codec.topk) * double(n) / codec.block_size * double(in.refs.size());
  std::printf("sparse aggregation (kept values only, one thread): %.3f s = %.1f ns per kept "
              "value, %zu coordinates touched (%.1f%%), %.1fx faster than the dense fold\n",
              sparse_s, 1e9 * sparse_s / kept_values, sparse->size(),
              100.0 * double(sparse->size()) / double(n), dense_s / sparse_s);
  outer::KeptBudget budget(UINT64_MAX);
  const double measure_s = Fastest([&](int) {
    if (!outer::Measure(in.payloads[0]).ok()) std::abort();
  });
  double fresh_s = 0;
  for (auto& p : in.payloads) {
    const auto t0 = Clock::now();
    if (!outer::MeasureAndKeep(&p, &budget).ok()) std::abort();
    fresh_s = std::max(fresh_s, Seconds(t0));
  }
  // The service reuses the storage of the round before: pages already mapped.
  in.payloads[0].DropKept();
  const auto t0 = Clock::now();
  if (!outer::MeasureAndKeep(&in.payloads[0], &budget).ok()) std::abort();
  const double warm_s = Seconds(t0);
  const double kept_s = Fastest(fold);
  std::printf("sparse aggregation of values decoded when checked: %.3f s (%.1fx); a push's "
              "check keeping them %.3f s into reused storage, %.3f s into fresh pages, %.3f s "
              "not keeping them; %.2f GB held\n",
              kept_s, sparse_s / kept_s, warm_s, fresh_s, measure_s,
              double(budget.in_use()) / 1e9);
}

// The sparse step alone (outer SGD): the union update encoded, decoded and subtracted, one thread.
void TimeSparseStep(const outer::SparseGradient& sparse, const compression::CodecSpec& codec,
                    std::vector<float>& g) {
  outer::OuterOptimizerConfig config;
  config.name = "sgd";
  Fill(g, 77);
  outer::FragmentData data(g, config);
  outer::FragmentData::SparseUpdate scratch;
  const double step_s = Fastest([&](int r) {
    if (!data.StepSparse(sparse, {"bench", "", uint64_t(r), 0}, codec, outer::kDefaultChunkBytes,
                         nullptr, &scratch).ok()) {
      std::abort();
    }
  });
  std::printf("sparse step (union update encoded and subtracted, one thread): %.3f s = "
              "%.1f ns per coordinate touched\n",
              step_s, 1e9 * step_s / double(sparse.size()));
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 50000000;
  const int islands = argc > 2 ? std::atoi(argv[2]) : 8;
  auto codec = *compression::ParseCodec(argc > 3 ? argv[3] : "fp4_e2m1");
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 3;
  const double density = argc > 5 ? std::atof(argv[5]) : 0;
  const std::string optimizer = argc > 6 ? argv[6] : "nesterov";
  if (density > 0) {
    codec = {codec.codec, 4096, uint32_t(std::max(1.0, std::round(density * 4096)))};
  }
  std::printf("%llu elements, %d islands, %s, %s, median of %d rounds\n", (unsigned long long)n,
              islands, compression::SpecText(codec).c_str(), optimizer.c_str(), rounds);
  {
    std::vector<float> g(n);
    Contributions in = MakeContributions(n, islands, codec, g);
    const double dense_s = TimeDenseAggregation(in, n, g);
    if (codec.sparse()) {
      outer::SparseGradient sparse;
      TimeSparseAggregation(in, n, codec, dense_s, &sparse);
      if (optimizer == "sgd") TimeSparseStep(sparse, codec, g);
    }
  }
  if (rounds == 0) return 0;  // the parts alone
  const double one = TimeCommits(n, islands, codec, rounds, 1, optimizer);
  const double two = TimeCommits(n, islands, codec, rounds, 2, optimizer);
  std::printf("commit, 1 service thread:  %.3f s\n", one);
  std::printf("commit, 2 service threads: %.3f s (%.2fx faster)\n", two, one / two);
  // Retired rounds' update buffers reused (above) or not: the gap is fresh pages' cost. Run with
  // MALLOC_MMAP_THRESHOLD_=262144 to map big buffers on their own, as the coordinator does.
  const double held = TimeCommits(n, islands, codec, rounds, 1, optimizer, true);
  std::printf("commit, 1 service thread, every round held (no buffer reused): %.3f s (%.2fx)\n",
              held, held / one);
  return 0;
}
