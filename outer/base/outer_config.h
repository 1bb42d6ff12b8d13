// Configuration of the outer loop (the [outer] section), in torchft's vocabulary where it has one.
#ifndef ATOLL_OUTER_BASE_OUTER_CONFIG_H_
#define ATOLL_OUTER_BASE_OUTER_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "compression/codec.h"
#include "outer/base/aggregation.h"
#include "outer/base/fragments.h"
#include "outer/base/grace.h"
#include "outer/base/outer_optimizer.h"

namespace atl::outer {

// Sync rounds, or async: contributions applied as they arrive (arXiv 2401.09135).
enum class OuterMode { kSync, kAsync };
absl::Status ParseConfigValue(const std::string& text, OuterMode* value);
std::string ConfigValueText(OuterMode value);

// What ends a sync run: every island's train.steps (an island that was away trains the steps it
// owes: the run takes longer), or the run's tokens, islands x train.steps x tokens per step,
// committed by whichever islands trained them (an island that is up or faster trains more; the
// learning-rate schedule follows the run's tokens). Async runs always end at their tokens.
enum class RunEnd { kSteps, kTokens };
absl::Status ParseConfigValue(const std::string& text, RunEnd* value);
std::string ConfigValueText(RunEnd value);

// Where an island's rank keeps its copy of the global parameters for making pseudo-gradients:
// "device" (beside the parameters: made, encoded and merged there), "host" (made and encoded on
// the host from a copy of the parameters), "auto" (device when the rank trains on a GPU).
enum class GlobalCopy { kAuto, kDevice, kHost };
absl::Status ParseConfigValue(const std::string& text, GlobalCopy* value);
std::string ConfigValueText(GlobalCopy value);

// The [outer] section. What the service decides for every island (the schedule it announces at
// join: H, the phases, the fragments, the mode, the run's steps) is read by the service alone
// (ServiceOptions, outer/service/service_options.h); what each island chooses for itself (tau, alpha,
// codec, error feedback, rounding) by the island (IslandChoicesOf, outer/island/outer_step.h).
struct OuterConfig {
  static constexpr const char* kSection = "outer";
  std::string run_id = "atoll";      // every RPC names it; a service refuses other runs
  int sync_every = 50;               // H: inner steps per outer round
  SyncPhases phases;                 // sync: a warm start and an early H before H (fragments.h)
  OuterOptimizerConfig optimizer;    // outer.lr, outer.momentum, outer.nesterov
  int islands = 2;                   // islands of the run (its disjoint data streams)
  int min_islands = 1;               // contributions that commit a round at its deadline
  double round_timeout_s = 600;      // a round's deadline after its first contribution
  // Sync: how long a round with its quorum waits for the rest (outer/base/grace.h).
  GraceSpec grace;
  double rpc_timeout_s = 60;         // deadline of every other RPC
  double heartbeat_s = 1;            // islands renew their lease this often
  double lease_s = 5;                // an island silent this long is dead and dropped
  double reconnect_timeout_s = 60;   // islands retry joining (backoff + jitter) this long
  int durable_every = 1;             // the coordinator writes its state every K rounds
  int join_warmup_steps = 0;         // a late joiner's fresh AdamW ramps its lr up over this many steps
  // Sync: the islands' inner-optimizer moments averaged through the service every this many
  // rounds of each fragment, and a joiner's taken from the newest average (0: never).
  int moment_sync_every = 0;
  // An island checkpoints every this many rounds (every outer.sync_every x this many steps, in
  // the background: the training thread only copies the state), so that a restart loses at most
  // the steps since then; 0: only at train.checkpoint_every.
  int checkpoint_rounds = 1;
  int spike_window = 50;             // loss-spike guard: recent losses compared against (0: off)
  double spike_factor = 8;           // ... robust standard deviations above their median
  compression::CodecSpec codec;      // pseudo-gradients and outer updates on the wire (fp32)
  // Sparse pseudo-gradients (SparseLoCo, arXiv 2508.15706): each chunk of topk_chunk elements
  // keeps its round(topk_density x topk_chunk) largest magnitudes, values in `codec`; 1: dense.
  double topk_density = 1;
  int topk_chunk = 4096;
  bool error_feedback = false;       // islands carry what the codec dropped into the next round
  double error_feedback_decay = 1;   // beta: e <- beta e + delta before encoding (1: plain EF)
  GlobalCopy global_copy = GlobalCopy::kAuto;
  bool stochastic_rounding = false;  // islands round pseudo-gradients stochastically
  // Streaming DiLoCo.
  int num_fragments = 1;                  // P
  FragmentPattern fragment_pattern = FragmentPattern::kStrided;
  int fragment_sync_delay = 0;            // tau: inner steps between a fragment's push and merge
  // Sync: the service chooses tau from the islands' measured links and step times to reach
  // target_utilization (outer/service/auto_tune.h); fragment_sync_delay is the tau until it has.
  bool auto_tune = false;
  double target_utilization = 0.95;
  double auto_tune_headroom = 2;  // plan as if transfers took this many times as long as measured
  double fragment_update_alpha = -1;      // alpha; < 0: 0.5 when tau > 0, else 0
  // Eager updates (arXiv 2502.12996; outer/island/eager_update.h): while a round is in flight the island
  // trains on a stand-in for its update (the last one, with its own share refreshed), swapped for
  // the update when it lands (instead of the alpha merge). Sync rounds with tau > 0; host copies.
  bool eager_updates = false;
  // Async DiLoCo (arXiv 2401.09135).
  OuterMode mode = OuterMode::kSync;
  RunEnd run_end = RunEnd::kSteps;
  // Rounds (sync) or versions (async) a contribution may be stale; -1: 1 round in sync mode (a
  // push after its round committed is folded into the next), 16 versions in async mode.
  int max_staleness = -1;
  bool staleness_scaling = true;          // async: scale a contribution by 1 / (1 + staleness)
  bool dynamic_local_steps = true;  // async, sync ending at its tokens: each island's H (DyLU)
  int momentum_delay = 0;                 // async: delayed Nesterov period N (0: outer.islands)
  // Hostile or broken islands (the service refuses or outvotes what no healthy island sends).
  AggregationRule aggregation = AggregationRule::kMean;
  double clip_multiple = 2.0;             // clipped_mean: norms clipped to this x the round's median
  double trim_fraction = 0.25;            // trimmed_mean: share of values dropped at each end
  double copy_overlap = 0;                // sparse copies: kept index sets sharing this share
  double copy_cosine = 0;                 // dense copies: values at this cosine
  // Contributions earn their weight (outer/base/scoring.h): "off" or "loss_probe".
  std::string scoring = "off";
  int probe_batches = 2;                  // held-out batches (of data.batch_size) the probe runs
  double reputation_decay = 0.8;
  double reputation_floor = 0.5;          // full weight at or above
  double exclude_below = 0.2;
  int exclude_rounds = 5;
  double leave_one_out_t = 3.5;           // evidence that an island pulls the average apart (0: off)
  double step_guard = 0.1;                // an outer step this far above the plain average's loss
  // A hostile island, for rehearsing the defences: "none", "sign_flip" (its pseudo-gradient
  // negated), "noise" (replaced by Gaussian noise of the same norm) or "copy" (it trains another
  // island's data stream with that island's seeds, so its pushes equal that island's).
  std::string fault = "none";
  int fault_rounds = 0;                   // the fault lasts the first rounds of each fragment (0: all)
  // Bounds a healthy island stays far below: AdamW moves a weight by at most about lr per step, and
  // tiny's pseudo-gradients measure 0.02 to 0.31 of their fragment's parameter norm (H = 50).
  double max_update_norm = 10;            // contribution norm / fragment parameter norm (0: none)
  double max_update_value = 1000;         // largest magnitude of any value (0: none)
  // The coordinator's resource limits (see src/net/grpc_server.h).
  double stream_idle_timeout_s = 60;      // a push stream silent this long is cancelled
  double stream_first_message_s = 10;    // ... or without its first message this long
  int max_pending_calls = 64;             // calls not (yet) tied to a member, at once
  int max_calls_per_island = 32;          // calls running at once for one island
  // Threads for a commit's data work (1..256; 0: the cores the service may use, CPU affinity and
  // cgroup quota counted: outer/service/service_options.h).
  int service_threads = 0;
  // TCP connections of each island rank to the service (1..64): payloads are striped over them,
  // for links whose bandwidth-delay product one TCP stream cannot fill.
  int connections = 1;
  // Shard servers holding the outer state (1..64; 1: the coordinator holds it). Fragment f lives
  // on shard f mod shards (`atoll sync-server --shard K/N`); the coordinator keeps membership and
  // the schedule. Needs num_fragments >= shards and sync mode.
  int shards = 1;
  bool async() const { return mode == OuterMode::kAsync; }
  bool sparse() const { return topk_density < 1; }
  // The encoding of pseudo-gradients on the wire: `codec`, sparse when topk_density < 1 (the
  // outer updates follow from it: outer/base/payload.h, UpdateEncoding).
  compression::CodecSpec wire_codec() const;
  double alpha() const {
    if (fragment_update_alpha >= 0) return fragment_update_alpha;
    return fragment_sync_delay > 0 || auto_tune ? 0.5 : 0.0;
  }
};

namespace outer_keys {

// [outer]: the rounds and the outer optimizer.
template <class V>
void RoundsKeys(OuterConfig& c, V&& v) {
  v("run_id", c.run_id, "run name every RPC carries");
  v("sync_every", c.sync_every, "H: inner steps per outer round");
  v("warm_start_steps", c.phases.warm_start_steps,
    "the first steps are rounds of one step, plain averages (a data-parallel start; async: each "
    "island pushes each of its first steps, its share of a plain average)");
  v("early_sync_every", c.phases.early_sync_every,
    "sync: after the warm start, H for outer.early_sync_steps steps (0: off)");
  v("early_sync_steps", c.phases.early_sync_steps,
    "sync: how long outer.early_sync_every holds (a multiple of it)");
  v("optimizer", c.optimizer.name,
    "the service's outer optimizer: nesterov (SGD with Nesterov or heavy-ball momentum; plain SGD "
    "at momentum 0) or sgd");
  v("lr", c.optimizer.lr, "outer learning rate");
  v("momentum", c.optimizer.momentum, "outer momentum (0: plain SGD)");
  v("lr_warmup_rounds", c.optimizer.warmup_rounds,
    "outer lr ramps up linearly over a fragment's first rounds (async: of the run's progress)");
  v("lr_decay", c.optimizer.decay,
    "outer lr after warmup: constant or cosine (to outer.min_lr_ratio x outer.lr)");
  v("min_lr_ratio", c.optimizer.min_lr_ratio, "cosine's final outer lr / outer.lr");
  v("nesterov", c.optimizer.nesterov, "Nesterov momentum");
}

// [outer]: membership, deadlines and the island's guards.
template <class V>
void MembershipKeys(OuterConfig& c, V&& v) {
  v("islands", c.islands, "islands of the run (disjoint data streams)");
  v("min_islands", c.min_islands, "contributions that commit a late round");
  v("round_timeout_s", c.round_timeout_s, "round deadline after its first push");
  v("grace", c.grace,
    "sync: once a round has outer.min_islands contributions, how long it waits for the others "
    "(\"adaptive\": from recent arrival times, median + 3 MAD; \"off\": outer.round_timeout_s; "
    "or seconds); later pushes are folded into the next round (outer.max_staleness)");
  v("rpc_timeout_s", c.rpc_timeout_s, "deadline of every other RPC");
  v("heartbeat_s", c.heartbeat_s, "seconds between an island's heartbeats");
  v("lease_s", c.lease_s, "silence after which an island is dead and dropped");
  v("reconnect_timeout_s", c.reconnect_timeout_s,
    "how long islands retry joining (exponential backoff with jitter)");
  v("durable_every", c.durable_every,
    "K: the coordinator writes its state every K rounds (1: rounds are released once durable)");
  v("spike_window", c.spike_window,
    "loss-spike guard: recent losses to compare with (0: only non-finite losses)");
  v("spike_factor", c.spike_factor,
    "loss-spike guard: robust standard deviations above the median that make a spike");
  v("checkpoint_rounds", c.checkpoint_rounds,
    "islands checkpoint every this many rounds (in the background; a restart loses at most the "
    "steps since), besides train.checkpoint_every (0: only that)");
  v("join_warmup_steps", c.join_warmup_steps,
    "a late joiner ramps its learning rate up over this many steps (fresh AdamW state)");
  v("moment_sync_every", c.moment_sync_every,
    "sync: every this many rounds the islands' optimizer moments are averaged through the "
    "service (DES-LOC-like), and a joiner starts from the newest average (0: never)");
}

// [outer]: the encoding of pseudo-gradients.
template <class V>
void CodecKeys(OuterConfig& c, V&& v) {
  v("codec", c.codec, compression::CodecsHelp());
  v("topk_density", c.topk_density,
    "sparse pseudo-gradients: share of each chunk's values kept (largest magnitudes), in (0, 1]; "
    "1: dense");
  v("topk_chunk", c.topk_chunk,
    "sparse pseudo-gradients: elements per chunk, each keeping its own top-k (32..4096, a "
    "multiple of 32)");
  v("error_feedback", c.error_feedback, "carry codec error into the next round");
  v("error_feedback_decay", c.error_feedback_decay,
    "beta of error feedback: the residual is scaled by it before the next pseudo-gradient is "
    "added (SparseLoCo's accumulator; 1: plain error feedback)");
  v("global_copy", c.global_copy,
    "where pseudo-gradients are made: device (beside the parameters), host, or auto");
  v("stochastic_rounding", c.stochastic_rounding,
    "round pseudo-gradients stochastically (unbiased) instead of to nearest");
}

// [outer]: Streaming DiLoCo: fragments, overlap, merge.
template <class V>
void StreamingKeys(OuterConfig& c, V&& v) {
  v("num_fragments", c.num_fragments, "P: Streaming DiLoCo fragments");
  v("fragment_pattern", c.fragment_pattern, "strided or sequential blocks");
  v("fragment_sync_delay", c.fragment_sync_delay, "tau: steps of overlap");
  v("auto_tune", c.auto_tune,
    "sync: the coordinator chooses tau from the islands' measured links and step times");
  v("target_utilization", c.target_utilization,
    "auto_tune: the compute utilization tau is chosen to reach");
  v("auto_tune_headroom", c.auto_tune_headroom,
    "auto_tune: plan as if transfers took this many times as long as measured (jitter)");
  v("eager_updates", c.eager_updates,
    "while a round is in flight, train on a stand-in for its update (the last update, with the "
    "island's own share refreshed), swapped for the update when it lands (replaces the alpha merge)");
  v("fragment_update_alpha", c.fragment_update_alpha,
    "alpha of the merge (negative: 0.5 if tau > 0 or auto_tune, else 0)");
}

// [outer]: async mode.
template <class V>
void AsyncKeys(OuterConfig& c, V&& v) {
  v("mode", c.mode, "sync (rounds) or async (updates applied as they arrive)");
  v("run_end", c.run_end,
    "sync: \"steps\" (every island trains train.steps; one that was away trains what it owes) "
    "or \"tokens\" (the run's tokens, whoever trains them: islands that are up or faster train "
    "more); async runs end at their tokens");
  v("max_staleness", c.max_staleness,
    "sync: a push after its round committed, at most this many rounds late, is folded into the "
    "open round at weight 1 / (1 + staleness) (0: refused); async: versions; -1: 1 (sync), 16 "
    "(async)");
  v("staleness_scaling", c.staleness_scaling,
    "async: scale a contribution by 1 / (1 + staleness)");
  v("dynamic_local_steps", c.dynamic_local_steps,
    "async, and sync runs that end at their tokens: H of each island follows its inner "
    "throughput (DyLU)");
  v("momentum_delay", c.momentum_delay, "async: delayed Nesterov period N (0: outer.islands)");
}

// [outer]: aggregation and bounds on contributions.
template <class V>
void RobustKeys(OuterConfig& c, V&& v) {
  v("aggregation", c.aggregation,
    "mean, clipped_mean, trimmed_mean or median (robust to faulty islands)");
  v("clip_multiple", c.clip_multiple,
    "clipped_mean: norms clipped to this multiple of the round's median norm");
  v("trim_fraction", c.trim_fraction,
    "trimmed_mean: share of values dropped at each end, per coordinate");
  v("copy_overlap", c.copy_overlap,
    "sparse: contributions whose kept indices share this share of the smaller set are copies, "
    "weighing as one (0: off; e.g. 0.9)");
  v("copy_cosine", c.copy_cosine,
    "dense: contributions at this cosine or more are copies, weighing as one (0: off; e.g. "
    "0.99)");
  v("scoring", c.scoring,
    "off, or loss_probe: the service scores each contribution by the held-out loss it buys and "
    "weighs islands by their reputation");
  v("probe_batches", c.probe_batches, "loss_probe: held-out batches (of data.batch_size) per probe");
  v("reputation_decay", c.reputation_decay,
    "loss_probe: reputation <- decay x reputation + (1 - decay) x the round's score");
  v("reputation_floor", c.reputation_floor,
    "loss_probe: full weight at or above this reputation (and readmission)");
  v("exclude_below", c.exclude_below, "loss_probe: an island below this reputation is excluded");
  v("exclude_rounds", c.exclude_rounds,
    "loss_probe: an excluded island's least time out, in its rounds");
  v("leave_one_out_t", c.leave_one_out_t,
    "loss_probe: an island whose leave-one-out evidence (the round's average does better without "
    "it, in standard errors, averaged over rounds) falls below minus this is left out (0: off)");
  v("step_guard", c.step_guard,
    "loss_probe: a round whose outer step leaves the held-out loss more than this fraction above "
    "the plain average of its contributions commits that average and restarts the outer "
    "momentum (0: off)");
  v("fault", c.fault,
    "island: none, or a rehearsed hostile role: sign_flip or noise (its pseudo-gradient "
    "negated, or replaced by noise of the same norm), or copy (it trains the data stream after "
    "its own, another island's, so its pushes equal that island's)");
  v("fault_rounds", c.fault_rounds,
    "island: the rehearsed fault lasts its pushes to the first this many rounds (0: all)");
  v("max_update_norm", c.max_update_norm,
    "refuse contributions whose norm exceeds this x the fragment's parameter norm (0: off)");
  v("max_update_value", c.max_update_value,
    "refuse contributions holding a value of larger magnitude (0: off)");
}

// [outer]: the service's and links' capacity.
template <class V>
void ServiceKeys(OuterConfig& c, V&& v) {
  v("stream_idle_timeout_s", c.stream_idle_timeout_s,
    "coordinator: cancel a push stream silent for this long");
  v("stream_first_message_s", c.stream_first_message_s,
    "coordinator: cancel a push stream whose first message (one chunk) has not arrived by then");
  v("max_pending_calls", c.max_pending_calls,
    "coordinator: calls not tied to a member (joins, queries), at once");
  v("max_calls_per_island", c.max_calls_per_island,
    "coordinator: calls running at once for one island");
  v("service_threads", c.service_threads,
    "coordinator: threads for a commit's aggregation, outer step, encoding and hashing (0: the "
    "cores it may use)");
  v("connections", c.connections,
    "island: TCP connections of each rank to the service; pushes, updates and state transfers "
    "are striped over them");
  v("shards", c.shards,
    "shard servers holding the outer state (atoll sync-server --shard K/N); fragment f on shard "
    "f mod shards, the coordinator keeps membership only");
}

}  // namespace outer_keys

// Every [outer] key in order (TOML, help and the resolved config list them so).
template <class V>
void VisitKeys(OuterConfig& c, V&& v) {
  outer_keys::RoundsKeys(c, v);
  outer_keys::MembershipKeys(c, v);
  outer_keys::CodecKeys(c, v);
  outer_keys::StreamingKeys(c, v);
  outer_keys::AsyncKeys(c, v);
  outer_keys::RobustKeys(c, v);
  outer_keys::ServiceKeys(c, v);
}

absl::Status Validate(const OuterConfig& config);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_OUTER_CONFIG_H_
