// Goodput of one island's outer sync over its connections to the service (outer.connections):
// a real coordinator service (gRPC over TCP) and a real island client (IslandSync over
// GrpcTransport) pushing pseudo-gradients of a fragment and receiving its updates, round after
// round, with 1, 2, 4, ... connections. The service and the island may run in different network
// namespaces behind a shaped link (deploy/link_check.sh), or both here on loopback.
//
//   build/tests/bench/link_bench local ELEMENTS CODEC ROUNDS CONNECTIONS,...
//   build/tests/bench/link_bench serve HOST:PORT ELEMENTS CODEC
//   build/tests/bench/link_bench push HOST:PORT ELEMENTS CODEC ROUNDS CONNECTIONS,...
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
  return v.empty() ? 0 : v[v.size() / 2];
}

std::unique_ptr<GrpcServer> Serve(outer::SyncServer* sync, const std::string& listen) {
  GrpcServerOptions so;
  so.listen = listen;
  so.token = "t";
  auto server = GrpcServer::Start(sync, so);
  if (!server.ok()) {
    std::fprintf(stderr, "link_bench: %s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(server);
}

std::unique_ptr<outer::SyncServer> MakeService(uint64_t n, const compression::CodecSpec& codec) {
  outer::SyncServerOptions o;
  o.run_id = "link";
  o.num_data_streams = 1;  // one island at a time: each push commits its round
  o.codec = codec;
  o.max_update_norm = 0;
  std::vector<float> init(n);
  for (uint64_t i = 0; i < n; ++i) init[i] = 0.02f * float((i * 2654435761u) % 1000) / 1000.0f;
  return std::make_unique<outer::SyncServer>(o, outer::FragmentLayout{{"w"}, {n}}, init);
}

// One island with `connections` connections: `rounds` rounds; prints its goodputs (medians).
bool Measure(const std::string& target, uint64_t n, const compression::CodecSpec& codec,
             int rounds, int connections) {
  GrpcTransportOptions t;
  t.target = target;
  t.token = "t";
  t.connections = connections;
  auto transport = GrpcTransport::Create(t);
  if (!transport.ok()) return false;
  pb::JoinRequest j;
  j.set_run_id("link");
  j.set_name(absl::StrCat("island-", connections, "-", getpid()));
  auto joined = (*transport)->Join(j);
  if (!joined.ok()) {
    std::fprintf(stderr, "link_bench: join: %s\n", joined.status().ToString().c_str());
    return false;
  }
  auto identity = std::make_shared<outer::IslandIdentity>(joined->island_id(), joined->session());
  // Heartbeats keep the island a member while its data is on the way, as a real island's do.
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    pb::HeartbeatRequest h;
    h.set_run_id("link");
    h.set_island_id(joined->island_id());
    h.set_session(joined->session());
    while (!stop.load()) {
      (*transport)->Heartbeat(h).IgnoreError();
      for (int i = 0; i < 10 && !stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Join() {
      stop = true;
      thread.join();
    }
  } join_heartbeats{stop, heartbeats};
  outer::IslandSyncOptions io;
  io.codec = codec;
  outer::IslandSync sync(transport->get(), "link", identity, n, io);
  const auto f0 = std::chrono::steady_clock::now();
  if (auto s = sync.FetchGlobal(); !s.ok()) {
    std::fprintf(stderr, "link_bench: fetch: %s\n", s.ToString().c_str());
    return false;
  }
  const double fetch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
  std::vector<double> push, update, round_s;
  uint64_t sent = 0, received = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<float> local = sync.global();
    for (uint64_t i = 0; i < n; ++i) local[i] -= 1e-3f * std::sin(float(i * uint64_t(r + 1)));
    auto out = sync.SyncRound(local, 1000);
    if (!out.ok()) {
      std::fprintf(stderr, "link_bench: round: %s\n", out.status().ToString().c_str());
      return false;
    }
    push.push_back(8e-6 * double(out->bytes_sent) / out->push_s);
    update.push_back(8e-6 * double(out->bytes_received) / out->wait_s);
    round_s.push_back(out->push_s + out->wait_s);
    sent = out->bytes_sent;
    received = out->bytes_received;
  }
  std::printf("%11d %12.1f %12.1f %14.1f %9.3f %10.2f %10.2f\n", connections, Median(push),
              Median(update), 8e-6 * double(sync.fetched_bytes()) / fetch_s, Median(round_s),
              double(sent) / double(1 << 20), double(received) / double(1 << 20));
  std::fflush(stdout);
  pb::LeaveRequest l;
  l.set_run_id("link");
  l.set_island_id(joined->island_id());
  l.set_session(joined->session());
  (*transport)->Leave(l).IgnoreError();
  return true;
}

void Header(uint64_t n, const char* codec, int rounds) {
  std::printf("one island, %llu parameters, %s, %d rounds (medians); goodput in Mbit/s\n",
              (unsigned long long)n, codec, rounds);
  std::printf("%11s %12s %12s %14s %9s %10s %10s\n", "connections", "push", "update",
              "state fetch", "round s", "sent MiB", "recv MiB");
}

int Usage() {
  std::fprintf(stderr,
               "usage: link_bench local ELEMENTS CODEC ROUNDS CONNECTIONS,...\n"
               "       link_bench serve HOST:PORT ELEMENTS CODEC\n"
               "       link_bench push HOST:PORT ELEMENTS CODEC ROUNDS CONNECTIONS,...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string mode = argv[1];
  const int base = mode == "local" ? 2 : 3;  // index of ELEMENTS
  if (argc < base + 2 || (mode == "serve" && argc != 5) || (mode != "serve" && argc != base + 4)) {
    return Usage();
  }
  uint64_t n = 0;
  auto codec = compression::ParseCodec(argv[base + 1]);
  if (!absl::SimpleAtoi(argv[base], &n) || n == 0 || !codec.ok()) return Usage();
  if (mode == "serve") {
    auto sync = MakeService(n, *codec);
    auto server = Serve(sync.get(), argv[2]);
    std::printf("link_bench: serving %s\n", server->address().c_str());
    std::fflush(stdout);
    while (true) std::this_thread::sleep_for(std::chrono::seconds(60));
  }
  int rounds = 0;
  if (!absl::SimpleAtoi(argv[base + 2], &rounds) || rounds < 1) return Usage();
  std::vector<int> connections;
  for (absl::string_view c : absl::StrSplit(argv[base + 3], ',')) {
    int k = 0;
    if (!absl::SimpleAtoi(c, &k) || k < 1) return Usage();
    connections.push_back(k);
  }
  std::unique_ptr<outer::SyncServer> sync;
  std::unique_ptr<GrpcServer> server;
  std::string target = mode == "push" ? argv[2] : "";
  if (mode == "local") {
    sync = MakeService(n, *codec);
    server = Serve(sync.get(), "127.0.0.1:0");
    target = server->address();
  } else if (mode != "push") {
    return Usage();
  }
  Header(n, argv[base + 1], rounds);
  for (int c : connections) {
    if (!Measure(target, n, *codec, rounds, c)) return 1;
  }
  return 0;
}
