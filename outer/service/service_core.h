// What every part of the outer-sync service shares (outer/service/sync_server.h): its options, one
// lock and its condition variables, the fragments (their rounds, contributions and data), the
// membership, the events it logs. The parts (membership desk, rounds, state store, shard link)
// each hold a reference to it; none owns another.
//
// Locking: `mu` guards everything here but a fragment's `data`, and is only ever held briefly; a
// fragment's `data_mu` guards its `data` (parameters, optimizer) and is held through a commit's
// data work. Lock order: data_mu, then mu (never data_mu while holding mu).
#ifndef ATOLL_OUTER_SERVICE_SERVICE_CORE_H_
#define ATOLL_OUTER_SERVICE_SERVICE_CORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "outer/base/fragment_data.h"
#include "outer/base/payload.h"
#include "outer/base/reused_buffers.h"
#include "outer/base/scoring.h"
#include "outer/base/worker_pool.h"
#include "outer/service/token_ledger.h"
#include "outer/service/log_limiter.h"
#include "outer/service/membership.h"
#include "outer/service/sync_types.h"

namespace atl::outer {

// A verified contribution, kept encoded until its round commits.
struct Contribution {
  EncodedPayload payload;
  uint64_t tokens = 0;
  double norm = 0;
  uint64_t base_round = 0;  // the round it was made for (a late one's is older than its fold's)
  uint64_t step = 0;        // the island's inner step when it pushed
  uint64_t weight = 0;      // its weight in the round's mean (Rounds::WeightLocked)
};

// An island's contribution while its ranks' pushes arrive (each carries the ranges it owns).
struct PartialContribution {
  uint64_t round = 0;  // async: the version it started from
  EncodedPayload payload;
  uint64_t tokens = 0;
  double sum_squares = 0;
};

// One fragment on the service: its global parameters and outer optimizer (`data`), its open
// round and what has arrived for it, the rounds it keeps for islands that fetch late.
struct ServiceFragment {
  ServiceFragment(FragmentLayout l, std::vector<float> p, const OuterOptimizerConfig& o);
  FragmentLayout layout;
  std::unique_ptr<std::mutex> data_mu;
  FragmentData data;         // under data_mu
  std::unique_ptr<float[]> accumulator;  // under data_mu: the commits' aggregate, reused
  SparseGradient sparse_sums;            // under data_mu: a sparse round's, reused
  FragmentData::SparseUpdate sparse_update;  // under data_mu: its update, decoded, reused
  uint64_t params_hash = 0;  // of `data`'s parameters as published by the last commit
  double params_norm = 0;    // L2, for the relative bound on contributions
  bool committing = false;   // sync: the round's contributions are being committed
  uint64_t round = 0;
  std::map<std::string, Contribution> contributions;  // of `round`, by island id
  // Sync: late contributions, folded into the next commit (by island id).
  std::map<std::string, Contribution> late;
  std::map<std::string, PartialContribution> partials;  // incomplete ones, by island id
  std::map<std::string, std::pair<uint64_t, pb::PushResponse>> applied;  // async: last, by island
  std::set<std::pair<uint64_t, uint64_t>> known_ranges;  // [begin, end) ranks own
  absl::Time deadline = absl::InfiniteFuture();
  absl::Time opened = absl::InfinitePast();  // the open round's first contribution
  // Sync, the grace window (outer/base/grace.h): when the open round reached its quorum and when
  // its latest contribution arrived, the previous round's quorum, the window it got (-1: none),
  // and the complete rounds' arrivals.
  absl::Time grace_deadline = absl::InfiniteFuture();  // quorum + window (`deadline`: the fixed one)
  absl::Time quorum_at = absl::InfinitePast();
  absl::Time last_arrival = absl::InfinitePast();
  absl::Time previous_quorum_at = absl::InfinitePast();
  double grace_s = -1;
  ArrivalHistory arrivals;
  std::deque<std::shared_ptr<CommittedRound>> committed;  // newest last
  // Sync, under data_mu: the islands the last commit folded in (the step guard's: the outer
  // momentum carries their contributions).
  std::set<std::string> last_folded;
  SpareChunkData spare_chunks;  // under mu: update buffers for the next commit
  bool spare_warming = false;   // under mu: buffers for spare_chunks are being written
  std::map<std::string, uint64_t> last_base;  // async: newest base version pushed, by island
  uint64_t durable_round = 0;                 // rounds of this fragment in a durable snapshot
};

// "the service", "the coordinator", "shard K of N".
std::string ShardName(const SyncServerOptions& options);

struct ServiceCore {
  ServiceCore(SyncServerOptions o, std::vector<FragmentLayout> layouts,
              std::vector<std::vector<float>> initial);

  // NOT_FOUND another run.
  absl::Status CheckRun(const std::string& run_id) const;
  // NOT_FOUND an unknown fragment, FAILED_PRECONDITION another shard's.
  absl::StatusOr<uint32_t> CheckFragment(uint32_t fragment) const;
  // The run's sync schedule (which step each round of each fragment is due after).
  SyncSchedule Schedule() const {
    return SyncSchedule(int(options.sync_every), int(fragments.size()), options.phases);
  }
  // The schedule islands are told at join and by GetState (one source for both).
  void FillSchedule(pb::OuterSchedule* schedule) const;
  bool is_control_plane() const {
    return options.num_shards > 1 && options.shard == SyncServerOptions::kControlPlane;
  }
  bool is_shard() const { return options.num_shards > 1 && options.shard >= 0; }

  // Under mu:
  // Logs "<key><rest>" unless the key's lines are over their rate (outer/service/log_limiter.h).
  void EventLocked(const std::string& key, const std::string& rest);
  // The earliest step an island joining now can resume from (Member::resume_floor).
  int64_t ResumeFloorLocked() const;
  // The run has trained everything it was set up for (islands leaving then is the normal end).
  bool AllDoneLocked() const;

  const SyncServerOptions options;
  std::unique_ptr<WorkerPool> pool;  // a commit's data work
  // outer.scoring: every island's standing across rounds (its own lock; part of the durable state).
  Reputation reputation;
  mutable std::mutex mu;
  std::condition_variable committed_cv;   // a round committed or became durable
  std::condition_variable membership_cv;  // the membership epoch changed
  std::vector<ServiceFragment> fragments;
  Membership membership;
  // The run's full complement of islands has joined once: the first round stops waiting for
  // latecomers (an island that died before it contributed is not waited for).
  bool complement_reached = false;
  absl::Time complement_deadline = absl::InfiniteFuture();  // after a resume: stop waiting then
  std::vector<uint64_t> first_rounds;  // per fragment: the round the run started or resumed at
  bool resumed = false;  // restored from a durable state (pushes to its first rounds were lost)
  bool durability_gate = false;
  uint64_t lease_expiries = 0;  // members dropped for silence since the service started
  uint64_t tokens_committed = 0;
  // Control plane: each shard's address (empty until it called). The rounds of the fragments are
  // those the shards last reported.
  std::vector<std::string> shard_addresses;
  // Control plane: whether each shard's rounds are known as of the run's end. Once every member
  // has finished, every round has committed (an island lands its last rounds before it says it
  // finished), but the rounds a shard reported before that may be older. Until each shard has
  // reported after it (ShardLink wakes its long poll), a heartbeat counts the run as still
  // training, so that the versions a finished island catches up to are the shards' last rounds.
  struct EndReports {
    absl::Time finished_at = absl::InfiniteFuture();  // every member had finished (future: not)
    std::vector<absl::Time> answered;  // each shard's last long poll, when it was answered
    std::vector<bool> fresh;           // its rounds were reported after finished_at
  } end_reports;
  TokenLedger ledger;  // where each island's tokens went (fragment 0)
  std::function<void(const CommittedRound&)> on_commit;
  std::function<void(const std::string&)> on_event;
  // Membership events (joins, leaves, deaths) are logged per island at a bounded rate.
  LogLimiter event_limiter;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SERVICE_CORE_H_
