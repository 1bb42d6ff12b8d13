// The outer-sync service's vocabulary: its options, its fragments' layouts, a committed round as
// the islands receive it, and what it shows of the run. Shared by the service's parts
// (outer/service/sync_server.h) and whoever hosts them.
#ifndef ATOLL_OUTER_SERVICE_SYNC_TYPES_H_
#define ATOLL_OUTER_SERVICE_SYNC_TYPES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "atoll/v1/outer.pb.h"
#include "compression/codec.h"
#include "outer/base/grace.h"
#include "outer/base/aggregation.h"
#include "outer/base/fragments.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/payload.h"
#include "outer/base/update_recipe.h"
#include "outer/service/token_ledger.h"

namespace atl::outer {

struct SyncServerOptions {
  std::string run_id = "run";
  OuterOptimizerConfig optimizer;
  int min_islands = 1;             // contributions needed to commit at the deadline
  double round_timeout_s = 600;    // deadline, counted from a round's first contribution
  // Sync: how long a round with min_islands contributions waits for the rest (outer/base/grace.h).
  // Off by default here (tests that build options by hand wait as before); the config's default
  // is adaptive.
  GraceSpec grace = {GraceSpec::Mode::kOff, 0};
  double grace_floor_s = kGraceFloorSeconds;  // the adaptive window's least
  uint32_t sync_every = 100;       // H, told to islands at join
  uint64_t total_inner_steps = 0;  // told to islands at join
  SyncPhases phases;               // sync: warm start (plain averages) and early H, told at join
  uint32_t moment_sync_every = 0;  // sync: rounds between moment averages (0: none), told at join
  uint32_t num_data_streams = 1;   // the run's islands: disjoint data streams handed out at join
  uint64_t config_hash = 0;        // islands with another model config are refused
  double lease_s = 5;              // a member silent for this long is dead and dropped
  size_t chunk_bytes = kDefaultChunkBytes;
  // Codec of pseudo-gradients and outer updates. Full state always travels as fp32.
  compression::CodecSpec codec = {compression::Codec::kFp32, 0};
  // Async mode: every contribution is applied as it arrives (one version per contribution, with
  // the optimizer's delayed Nesterov); there are no rounds to wait for.
  bool async = false;
  uint32_t max_staleness = 16;      // async: versions; staler contributions are refused
  // Sync: a push that arrives after its round committed (or while it commits), from a member, at
  // most this many rounds after the round it was made for, is folded into the open round with its
  // weight scaled by 1 / (1 + staleness) (outer/service/rounds.h); 0: refused, as before.
  uint32_t sync_max_staleness = 0;
  bool staleness_scaling = false;   // scale a contribution by 1 / (1 + staleness)
  bool dynamic_local_steps = true;  // DyLU: each island's H follows its measured throughput
  uint64_t token_budget = 0;        // tokens over all islands after which islands finish (0: none)
  // Threads for a commit's data work (aggregation, the outer step, encoding, hashing); commits run
  // outside the lock that membership, heartbeats and pushes take.
  int service_threads = 1;
  // Sync: a round of sparse contributions under a linear step (outer SGD, a warm start's average)
  // commits in time proportional to what it changed (outer/base/fragment_data.h); false commits it
  // as a dense round, the reference the sparse commit equals bit for bit.
  bool sparse_commits = true;
  AggregationOptions aggregation;   // how a round's contributions are combined
  // Sync: each contribution scored by the held-out loss it buys, islands weighed by their
  // reputation (outer/base/scoring.h); the probe is the host's (it holds the model).
  ScoringOptions scoring;
  std::shared_ptr<LossProbe> loss_probe;
  // Bounds on a contribution, refused with INVALID_ARGUMENT beyond them (0: no bound): its L2 norm
  // relative to the fragment's parameter norm and the magnitude of any of its values.
  double max_update_norm = 0;
  double max_update_value = 0;
  // The tokens one data-parallel rank trains in one inner step (batch x accumulation x context;
  // 0: claims unbounded). A contribution may claim at most its round's steps (ClaimBound) x this x
  // the island's declared data-parallel ranks: the weight of a contribution follows the round
  // actually run (a warm-start round is one step), whatever a peer claims.
  uint64_t tokens_per_step = 0;
  // Sync mode: choose tau for the islands from their measured throughput and links, to reach this
  // compute utilization (outer/service/auto_tune.h). 0: off (islands keep their configured tau).
  double auto_tune_target = 0;
  double auto_tune_headroom = 1;    // as if transfers took this many times as long as measured
  // A sharded service (num_shards > 1): fragment f lives on shard f % num_shards. The coordinator
  // (shard = kControlPlane) keeps membership and the schedule and holds no fragment's data; a
  // shard server (shard 0 .. num_shards - 1) holds its fragments, mirrors the coordinator's
  // membership (MirrorMembership) and refuses membership calls.
  static constexpr int kControlPlane = -1;
  uint32_t num_shards = 1;
  int shard = 0;
};

// A wait polls a caller's `cancelled` this often (a caller that went away frees its thread then,
// not at the deadline).
inline constexpr absl::Duration kCancelPoll = absl::Milliseconds(200);

// Whether `fragment` lives on `shard` (always, unsharded).
bool ShardOwns(const SyncServerOptions& options, uint32_t fragment);

// Dynamic local updates (arXiv 2401.09135): an island running at `v` inner steps/s while the
// fastest runs at `v_max` syncs every max(1, floor(v / v_max * h)) steps, so all islands push at
// about the same wall-clock rate.
uint32_t DynamicLocalSteps(double v, double v_max, uint32_t h);

// The parameters that make up one fragment (the whole model when there is one), in flat order.
struct FragmentLayout {
  std::vector<std::string> names;
  std::vector<uint64_t> numels;
  uint64_t total() const;
};

// An island's telemetry is shown, never used: values that are not finite or out of their range
// (loss and val_loss in [0, 1e4], tokens_per_s in [0, 1e12], utilization in [0, 1]) are refused
// with INVALID_ARGUMENT naming the field, so a broken island cannot put garbage on the page.
absl::Status ValidateTelemetry(const pb::IslandTelemetry& telemetry);

// A committed round, as every island receives it.
struct CommittedRound {
  uint64_t round = 0;
  uint32_t fragment = 0;
  // The update u (theta_new = theta - u, every copy subtracting the decoded chunks), encoded once
  // and kept only so. Or, when `recipe` has terms, u is relayed: each copy makes it from the
  // contributions (`relayed`, one per term, in `relayed_codec`) by the recipe
  // (outer/base/update_recipe.h).
  std::vector<pb::Chunk> update_chunks;
  UpdateRecipe recipe;
  std::vector<std::shared_ptr<const EncodedPayload>> relayed;
  compression::CodecSpec relayed_codec;
  uint64_t update_bytes = 0;  // of the chunks' (or the relayed payloads') data
  uint64_t params_hash = 0;            // XXH64 of the fp32 global parameters after the update
  std::vector<std::string> contributors;
  uint64_t tokens = 0;
  double commit_unix_s = 0;
  uint64_t staleness = 0;  // async: versions between the contribution's start and its arrival
  double grace_s = -1;     // sync: the grace window the round got after its quorum (-1: none)
  uint64_t run_tokens = 0;  // the run's tokens committed with this round (fragment 0's)
  // Sync: late contributions folded into this round (each made for an earlier round), and their
  // tokens (counted in `tokens` too, whole; weighed at 1 / (1 + staleness) in the mean).
  std::vector<std::string> stale_contributors;
  uint64_t stale_tokens = 0;
  // Fragment 0: where each island's tokens went since the previous commit (the token ledger's
  // slice: trained, on time, stale, refused by reason, recomputed; outer/service/token_ledger.h).
  std::map<std::string, TokenAccount> ledger;
  double round_s = 0;   // from the round's first contribution to its commit
  double commit_s = 0;  // the commit's data work: aggregation, outer step, encoding, hashing
  // Islands whose contributions were left out: their reputation excluded them (outer.scoring),
  // or the combination would have made the parameters non-finite (largest norm first); and what
  // the aggregation rule did.
  std::vector<std::string> dropped;
  // Islands whose contributions changed nothing (all zero): left out, their tokens not committed.
  std::vector<std::string> voided;
  // false: nothing usable, the round committed a zero update (its tokens reached no model).
  bool progress = true;
  AggregationReport aggregation;
  // Each contribution's L2 norm over the fragment's parameter norm before the round (a drifting or
  // broken island shows here first; outer.max_update_norm bounds it).
  std::map<std::string, double> relative_norms;
  // XXH64 of the parameters after the round over every range islands' ranks own (as seen in their
  // pushes and state fetches): each rank checks its range against these.
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> range_hashes;
};

// What the service knows of the run now (status page, metrics): members with their latest
// heartbeat and telemetry, former members with their end state.
struct IslandStatus {
  std::string island_id;
  std::string state;  // membership state name
  uint32_t data_stream = 0;
  uint32_t data_parallel = 1;  // as it declared at join (its claims' bound per step)
  bool member = false;
  bool finished = false;
  double silent_s = 0;     // since the island was last heard of
  uint64_t inner_step = 0;
  pb::IslandTelemetry telemetry;
  uint32_t flagged_claims = 0;  // its contributions that claimed more than its throughput allows
  TokenAccount tokens;          // where its trained tokens went (outer/service/token_ledger.h)
};
struct ServiceStatus {
  std::vector<IslandStatus> islands;  // members, then former members
  std::vector<uint64_t> rounds;       // the open round (version) of each fragment
  uint64_t committed_rounds = 0;
  uint64_t membership_epoch = 0;
  uint64_t lease_expiries = 0;        // members dropped for silence since the service started
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SYNC_TYPES_H_
