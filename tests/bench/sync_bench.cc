// Time per outer round of one island against a real coordinator on loopback (gRPC over TCP):
// the whole fragment in one stream (one rank) against the same fragment pushed and received by R
// ranks in parallel, each its own range and its own connection (FSDP's per-rank outer sync).
//
//   build/tests/bench/sync_bench [elements=10940000] [rounds=5] [ranks=2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "compression/codec.h"
#include "outer/island/island_sync.h"
#include "outer/service/sync_server.h"
#include "src/net/grpc_server.h"
#include "src/net/grpc_transport.h"

namespace {

using namespace atl;
namespace pb = ::atollpb::v1;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per round with `ranks` ranks splitting the fragment.
double TimeRounds(uint64_t n, int rounds, int ranks, const char* codec) {
  outer::SyncServerOptions o;
  o.run_id = "bench";
  o.num_data_streams = 1;
  o.codec = *compression::ParseCodec(codec);
  o.max_update_norm = 0;
  std::vector<float> init(n);
  for (uint64_t i = 0; i < n; ++i) init[i] = 0.02f * float((i * 2654435761u) % 1000) / 1000.0f;
  outer::SyncServer sync(o, {{"w"}, {n}}, init);
  GrpcServerOptions so;
  so.token = "t";
  auto server = *GrpcServer::Start(&sync, so);
  std::vector<std::unique_ptr<GrpcTransport>> transports;
  for (int r = 0; r < ranks; ++r) {
    GrpcTransportOptions t;
    t.target = server->address();
    t.token = "t";
    transports.push_back(*GrpcTransport::Create(t));
  }
  pb::JoinRequest j;
  j.set_run_id("bench");
  j.set_name("island");
  auto joined = *transports[0]->Join(j);
  auto identity = std::make_shared<outer::IslandIdentity>("island", joined.session());
  std::vector<std::unique_ptr<outer::IslandSync>> syncs;
  for (int r = 0; r < ranks; ++r) {
    outer::IslandSyncOptions io;
    io.codec = o.codec;
    if (ranks > 1) io.ranges = {{n * uint64_t(r) / ranks, n * uint64_t(r + 1) / ranks}};
    syncs.push_back(std::make_unique<outer::IslandSync>(transports[size_t(r)].get(), "bench",
                                                        identity, n, io));
    if (!syncs.back()->FetchGlobal().ok()) std::abort();
  }
  std::vector<double> times;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<float>> local;
    for (auto& s : syncs) {
      local.push_back(s->global());
      for (size_t i = 0; i < local.back().size(); ++i) local.back()[i] -= 1e-4f * float(i % 7);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        if (!syncs[size_t(r)]->SyncRound(local[size_t(r)], 1000).ok()) std::abort();
      });
    }
    for (auto& t : threads) t.join();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 10940000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int ranks = argc > 3 ? std::atoi(argv[3]) : 2;
  std::printf("one island, %llu parameters, %d rounds (median), loopback gRPC\n",
              (unsigned long long)n, rounds);
  std::printf("%-10s %16s %16s %8s\n", "codec", "1 stream (s)", "per-rank (s)", "ratio");
  for (const char* codec : {"fp32", "fp4_e2m1"}) {
    const double one = TimeRounds(n, rounds, 1, codec);
    const double many = TimeRounds(n, rounds, ranks, codec);
    std::printf("%-10s %16.3f %13.3f x%d %8.2f\n", codec, one, many, ranks, many / one);
  }
  return 0;
}
