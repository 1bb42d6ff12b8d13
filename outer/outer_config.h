// Configuration of the outer loop (the [outer] section), in torchft's vocabulary where it has one.
#ifndef ATOLL_OUTER_OUTER_CONFIG_H_
#define ATOLL_OUTER_OUTER_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "outer/fragments.h"
#include "outer/outer_optimizer.h"

namespace atl::outer {

struct OuterConfig {
  std::string run_id = "atoll";      // every RPC names it; a service refuses other runs
  int sync_every = 50;               // H: inner steps per outer round
  SyncPhases phases;                 // sync: a warm start and an early H before H (fragments.h)
  OuterOptimizerConfig optimizer;    // outer.lr, outer.momentum, outer.nesterov
  int islands = 2;                   // islands of the run (its disjoint data streams)
  int min_islands = 1;               // contributions that commit a round at its deadline
  double round_timeout_s = 600;      // a round's deadline after its first contribution
  double rpc_timeout_s = 60;         // deadline of every other RPC
  double heartbeat_s = 1;            // islands renew their lease this often
  double lease_s = 5;                // an island silent this long is dead and dropped
  double reconnect_timeout_s = 60;   // islands retry joining (backoff + jitter) this long
  int durable_every = 1;             // the coordinator writes its state every K rounds
  int join_warmup_steps = 0;         // a late joiner's fresh AdamW ramps its lr up over this many steps
  int spike_window = 50;             // loss-spike guard: recent losses compared against (0: off)
  double spike_factor = 8;           // ... robust standard deviations above their median
  std::string codec = "fp32";        // pseudo-gradients and outer updates on the wire
  bool error_feedback = false;       // islands carry what the codec dropped into the next round
  // Where an island's rank keeps its copy of the global parameters for making pseudo-gradients:
  // "device" (beside the parameters: made, encoded and merged there), "host" (made and encoded on
  // the host from a copy of the parameters), "auto" (device when the rank trains on a GPU).
  std::string global_copy = "auto";
  bool stochastic_rounding = false;  // islands round pseudo-gradients stochastically
  // Streaming DiLoCo.
  int num_fragments = 1;                  // P
  std::string fragment_pattern = "strided";  // or "sequential"
  int fragment_sync_delay = 0;            // tau: inner steps between a fragment's push and merge
  // Sync: the service chooses tau from the islands' measured links and step times to reach
  // target_utilization (outer/auto_tune.h); fragment_sync_delay is the tau until it has.
  bool auto_tune = false;
  double target_utilization = 0.95;
  double auto_tune_headroom = 2;  // plan as if transfers took this many times as long as measured
  double fragment_update_alpha = -1;      // alpha; < 0: 0.5 when tau > 0, else 0
  // Async DiLoCo (arXiv 2401.09135).
  std::string mode = "sync";              // or "async": contributions applied as they arrive
  int max_staleness = 16;                 // async: versions; staler contributions are refused
  bool staleness_scaling = true;          // async: scale a contribution by 1 / (1 + staleness)
  bool dynamic_local_steps = true;        // async: each island's H follows its throughput (DyLU)
  int momentum_delay = 0;                 // async: delayed Nesterov period N (0: outer.islands)
  // Hostile or broken islands (the service refuses or outvotes what no healthy island sends).
  std::string aggregation = "mean";       // mean, clipped_mean, trimmed_mean or median
  double clip_multiple = 2.0;             // clipped_mean: norms clipped to this x the round's median
  double trim_fraction = 0.25;            // trimmed_mean: share of values dropped at each end
  // Bounds a healthy island stays far below: AdamW moves a weight by at most about lr per step, and
  // tiny's pseudo-gradients measure 0.02 to 0.31 of their fragment's parameter norm (H = 50).
  double max_update_norm = 10;            // contribution norm / fragment parameter norm (0: none)
  double max_update_value = 1000;         // largest magnitude of any value (0: none)
  // The coordinator's resource limits (see src/net/grpc_server.h).
  double stream_idle_timeout_s = 60;      // a push stream silent this long is cancelled
  int max_pending_calls = 64;             // calls not (yet) tied to a member, at once
  int max_calls_per_island = 32;          // calls running at once for one island
  int service_threads = 1;                // threads for a commit's data work (1..256)
  // TCP connections of each island rank to the service (1..64): payloads are striped over them,
  // for links whose bandwidth-delay product one TCP stream cannot fill.
  int connections = 1;
  // Shard servers holding the outer state (1..64; 1: the coordinator holds it). Fragment f lives
  // on shard f mod shards (`atoll sync-server --shard K/N`); the coordinator keeps membership and
  // the schedule. Needs num_fragments >= shards and sync mode.
  int shards = 1;
  bool async() const { return mode == "async"; }
  double alpha() const {
    if (fragment_update_alpha >= 0) return fragment_update_alpha;
    return fragment_sync_delay > 0 || auto_tune ? 0.5 : 0.0;
  }
};

absl::Status Validate(const OuterConfig& config);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_OUTER_CONFIG_H_
