// A model of a run's schedule, for planning before any GPU is rented: given the model size, the
// inner step time, the islands and their links, it replays the run step by step (which fragments
// are due after each step, when each transfer starts and ends on the island's link, when the
// service commits, when the training thread must wait for an update) and reports the compute
// utilization (compute time / wall time), the traffic and the bytes in flight. No network, no torch.
//
// Two ways of moving a round's bytes:
// - kStar: atoll's service as it runs today. An island pushes its encoded pseudo-gradient up its
//   link, the service commits once every island's push has arrived, the island's wait for the
//   update (a second call, sent once the push is acknowledged) receives the encoded update down the
//   link. The push starts once the inner step that ends the round is done; fragments pushed after
//   the same step (a warm start's rounds: every fragment) share the link equally while in flight.
// - kRing: the assumptions of the Streaming DiLoCo paper's simulator (arXiv 2501.18512, Table 4):
//   a bandwidth-optimal all-reduce between islands (each island sends and receives
//   2 (M - 1) / M of the payload) that starts with the backward pass of the step that ends the
//   round (gradients or outer gradients reduced bucket by bucket as the backward produces them).
// Data parallel is always an all-reduce of the gradients every step, overlapped with the backward.
//
// A link: `bandwidth` bits/s in each direction, `latency` one way; one TCP stream carries at most
// its window per round trip, so `connections` streams carry connections x window / RTT at most.
#ifndef ATOLL_OUTER_BASE_PLANNER_H_
#define ATOLL_OUTER_BASE_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec_spec.h"
#include "outer/base/fragments.h"

namespace atl::outer {

enum class PlanMethod { kDataParallel, kDiLoCo, kStreaming };
enum class PlanTopology { kStar, kRing };

const char* PlanMethodName(PlanMethod method);
absl::StatusOr<PlanMethod> ParsePlanMethod(const std::string& name);
absl::StatusOr<PlanTopology> ParsePlanTopology(const std::string& name);

struct LinkModel {
  double bandwidth_bps = 1e9;  // per island, each direction
  double latency_s = 0;        // one way
  int connections = 1;
  double tcp_window_bytes = 4 << 20;  // per connection
  // What the island's streams carry at most: min(bandwidth, connections x window / RTT).
  double RateBps() const;
};

struct PlanInput {
  // Elements of each fragment (their sum is the model); one entry for DiLoCo and data parallel.
  std::vector<uint64_t> fragment_elements;
  double step_time_s = 0.1;  // one inner step's compute
  int islands = 2;
  LinkModel link;
  PlanMethod method = PlanMethod::kDiLoCo;
  PlanTopology topology = PlanTopology::kStar;
  int sync_every = 100;  // H
  int tau = 0;           // inner steps between a fragment's push and its merge (streaming)
  compression::CodecSpec codec = {compression::Codec::kFp32, 0};  // what travels
  // The outer step is linear (outer SGD, SparseLoCo's): the star relays sparse contributions, an
  // island receiving the M - 1 others' when that is smaller than their encoded union
  // (outer/base/update_recipe.h).
  bool linear_outer_step = true;
  // Inner steps of the run; the end of the run (every fragment pushed and merged in turn, as
  // atoll ends a run) is included. 0: the steady state (many rounds, no end).
  int64_t steps = 0;
  // A run's warm start and early H (outer/base/fragments.h), before H: they count only in a run of
  // `steps` (the steady state is the rounds after them).
  SyncPhases phases;
  double backward_fraction = 2.0 / 3.0;  // of the step (kRing, data parallel)
  // The service's commit (kStar): seconds per parameter per contributing island (one thread).
  double commit_s_per_param = 2.1e-9;
  // A sparse commit (sparse contributions, a linear outer step): seconds per value kept, summed
  // over the contributing islands (one thread): it decodes and folds the kept values, and encodes
  // and applies their union (measured by atoll loadtest, README's load-test table).
  double sparse_commit_s_per_value = 30e-9;
  // The service as configured (outer.service_threads, outer.shards): a commit's data work on
  // `service_threads` threads takes (1 - p + p / threads) of one thread's time (Amdahl, with the
  // parallel fraction p measured by commit_bench: 1.61x on 2 threads is p = 0.76); fragment f
  // commits on shard f mod shards, each shard one commit at a time (shards beyond the fragments
  // hold none).
  int service_threads = 1;
  int shards = 1;
  double commit_parallel_fraction = 0.76;
  // The service's own link (kStar), each way, shared by every island's pushes and updates (they
  // push together): an island's transfers go at most service_bandwidth / islands. 0: unlimited.
  double service_bandwidth_bps = 0;
};

// Every element count, bound and combination checked; names the first offending field.
absl::Status ValidatePlanInput(const PlanInput& in);

struct PlanResult {
  double utilization = 0;  // compute / wall
  double compute_s = 0, wall_s = 0, stall_s = 0;
  int64_t steps = 0;
  // Per island, per round of H steps (data parallel: per step).
  double bytes_sent_per_round = 0, bytes_received_per_round = 0;
  double bytes_per_hour = 0;      // sent + received, per island, at the simulated pace
  uint64_t peak_bytes_in_flight = 0;  // encoded pushes not yet merged (as an island counts them)
};

PlanResult Simulate(const PlanInput& in);

// The lowest link bandwidth (bits/s) at which Simulate reaches `target` utilization (to 0.5%);
// OUT_OF_RANGE when no bandwidth does (latency, TCP windows or the service's commit bound it).
absl::StatusOr<double> RequiredBandwidth(PlanInput in, double target);

// "1gbit", "20mbit", "100Mbit/s", "2.5e9" (bits/s); "50ms", "0.05s", "0" (seconds).
absl::StatusOr<double> ParseBandwidth(const std::string& text);
absl::StatusOr<double> ParseDuration(const std::string& text);
std::string FormatBandwidth(double bps);
std::string FormatBytes(double bytes);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_PLANNER_H_
