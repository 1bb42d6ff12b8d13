// The service's rounds and contributions: a push checked message by message and verified whole,
// the token claim it makes, its record (sync: it waits for its round; async: it is applied as it
// arrives), the commit that turns a round's contributions into the update every copy applies, and
// the islands' wait for it. A part of the sync server (outer/service/sync_server.h) over its
// shared core (outer/service/service_core.h).
//
// A round commits when every current member has contributed (the first round also waits until the
// run's num_data_streams islands have joined), or once its deadline has passed with at least
// min_islands contributions. At commit the service averages the pseudo-gradients weighted by
// tokens (in island-id order, so the result does not depend on arrival order), runs the outer
// optimizer, applies the update to its own copy and keeps the encoded update (or the relayed
// contributions) for the islands, which apply the same update to theirs and check the hash of the
// result.
#ifndef ATOLL_OUTER_SERVICE_ROUNDS_H_
#define ATOLL_OUTER_SERVICE_ROUNDS_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "outer/base/decoded_kept.h"
#include "outer/service/auto_tune.h"
#include "outer/service/service_core.h"

namespace atl::outer {

// What an async contribution's outer step depends on (Rounds::SetStepLocked).
struct AsyncStep {
  uint64_t island_step = 0;       // when it pushed, or the latest it pushed at before
  uint64_t tokens_committed = 0;  // the run's, before this contribution (its progress)
};

class Rounds;

// One Push call in progress on the service: opened after the cheap checks (run, fragment, member,
// round), fed message by message (each chunk checked before its bytes are kept: see ChunkStream),
// finished by Rounds::FinishPush. At most one per island and fragment is open at a time.
class PushStream {
 public:
  ~PushStream();
  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  absl::Status Add(pb::PushRequest&& request);
  const std::string& island() const { return chunks_.id().island_id; }
  // A push of moments (outer/service/moment_desk.h): the optimizer they are of; "" otherwise.
  const std::string& moments() const { return moments_; }

 private:
  friend class Rounds;
  friend class MomentDesk;
  PushStream(Rounds* rounds, ChunkStream chunks, uint64_t first_offset, std::string session,
             uint64_t tokens, uint64_t step, IslandFigures figures, KeptBudget* kept_budget);

  Rounds* rounds_;
  ChunkStream chunks_;
  // A sparse payload is measured as its chunks arrive (the first failure kept for FinishPush).
  std::optional<ChunkMeter> meter_;
  uint64_t first_offset_;  // with the island and fragment, the key of the open push
  std::string session_;
  uint64_t tokens_;
  uint64_t step_;  // the island's inner step at the push
  IslandFigures figures_;
  std::string moments_;
};

class Rounds {
 public:
  explicit Rounds(ServiceCore& core);

  // A member's claims since it joined are flagged past this many times what the highest
  // throughput its heartbeats reported could have trained in that time (an honest island's are at
  // most about 1x: its claims count the steps it trained, its throughput their wall-clock rate).
  static constexpr double kClaimFlagFactor = 3.0;
  // Claims are judged over at least this long since the membership's first contribution: a
  // shorter window measures noise, and after a rejoin that kept its progress the next push holds
  // steps trained while the island was away (at most a round's).
  static constexpr double kClaimMinWindowS = 2.0;

  // See SyncServer::LendBuffer.
  void LendBuffer(std::string* data) { push_buffers_.Lend(data); }
  // See SyncServer::OpenPush / FinishPush.
  absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const pb::PushRequest& first);
  absl::StatusOr<pb::PushResponse> FinishPush(std::unique_ptr<PushStream> stream);
  // See SyncServer::AwaitUpdate / AwaitRound.
  absl::StatusOr<std::shared_ptr<const CommittedRound>> AwaitUpdate(
      const pb::UpdateRequest& request, absl::Time deadline, const std::function<bool()>& cancelled);
  absl::StatusOr<std::shared_ptr<const CommittedRound>> AwaitRound(
      uint64_t round, absl::Time deadline, uint32_t fragment,
      const std::function<bool()>& cancelled);

  // A sync round taken for commit: its contributions, and what the commit needs from under mu.
  struct CommitJob {
    uint32_t fragment = 0;
    uint64_t round = 0;
    std::map<std::string, Contribution> contributions;
    std::map<std::string, Contribution> late;  // made for earlier rounds, folded into this one
    double params_norm = 0;
    std::set<std::pair<uint64_t, uint64_t>> known_ranges;
    absl::Time opened;  // the round's first contribution
    double grace_s = -1;  // the grace window the round got (-1: none)
    SpareChunkData spare;  // buffers for its update's chunks (ServiceFragment::spare_chunks)
  };
  // Under mu: marks every ready round as committing and hands its contributions over; the caller
  // runs the jobs with RunCommits once it has released mu (membership changes make rounds ready
  // too: an island that left is no longer waited for).
  std::vector<CommitJob> TakeReadyLocked(absl::Time now);
  // Under mu: whether every member the open round of `f` waits for has contributed.
  bool AllArrivedLocked(const ServiceFragment& f) const;
  // Under mu: a round that just reached its quorum gets its grace window (outer.grace).
  void OpenGraceLocked(ServiceFragment& f, absl::Time now);
  void RunCommits(std::vector<CommitJob> jobs);
  // Under mu: what the rounds kept for an island that left or died.
  void ForgetLocked(const std::string& island);
  // An island's data arrived or was read: its lease is renewed as by a heartbeat.
  void Renew(const std::string& island);
  // Under mu: the newest inner step of the island's recorded contributions to `fragment` (0: none),
  // kept across its leaving and coming back (a restarted island goes on from there).
  uint64_t DoneStepLocked(const std::string& island, uint32_t fragment) const;

  void SetCommitHookForTesting(std::function<void(uint32_t fragment)> hook) {
    commit_hook_ = std::move(hook);
  }

 private:
  friend class PushStream;
  // What a committed round records besides its update.
  struct RoundRecord {
    double grace_s = -1;
    std::vector<std::string> contributors;
    uint64_t tokens = 0;
    uint64_t staleness = 0;
    std::vector<std::string> stale_contributors;
    uint64_t stale_tokens = 0;
    std::vector<std::string> dropped;
    // For the token ledger: each contribution's island, tokens and whether it was late, and the
    // tokens of those left out (dropped).
    std::vector<std::tuple<std::string, uint64_t, bool>> accounted;
    std::vector<std::pair<std::string, uint64_t>> dropped_tokens;
    std::vector<std::pair<std::string, uint64_t>> voided;  // all-zero contributions: TakeVoid
    bool progress = true;  // false: a zero update, nothing usable
    AggregationReport aggregation;
    std::map<std::string, double> relative_norms;
  };
  // The data a commit produced, published under mu.
  struct CommitResult {
    std::vector<pb::Chunk> update;
    UpdateRecipe recipe;  // a relayed update: the recipe and its contributions, in its order
    std::vector<std::shared_ptr<const EncodedPayload>> relayed;
    RoundRecord record;
    uint64_t params_hash = 0;
    double params_norm = 0;
    std::map<std::pair<uint64_t, uint64_t>, uint64_t> range_hashes;
    std::vector<std::string> events;
    absl::Time opened = absl::InfinitePast(), started = absl::InfinitePast();  // round, data work
  };
  // The round's contributions as a relayed update would carry them (terms and payloads in the
  // order g was made in).
  struct Relayable {
    std::vector<UpdateTerm> terms;
    std::vector<std::shared_ptr<const EncodedPayload>> payloads;
    bool allowed = true;  // false: the round folds late contributions (one island, two terms)
  };
  // A contribution as a commit aggregates it: on time or late, its weight (a late one's tokens at
  // 1 / (1 + staleness), its share capped by BoundLateShares) and its whole tokens.
  struct CommitEntry {
    ContributionRef ref;
    std::shared_ptr<EncodedPayload> payload;  // const to all but the fold, which drops its decoding
    bool late = false;
    uint64_t tokens = 0;  // its claim
    uint64_t weight = 0;  // its tokens as the round weighs them, before staleness (WeightLocked)
  };
  std::vector<CommitEntry> CommitEntries(CommitJob& job) const;
  // Caps each late entry's share of the step at its own staleness (see rounds_commit.cc).
  static void BoundLateShares(std::vector<CommitEntry>& entries);
  using Dropped = std::vector<std::pair<std::string, uint64_t>>;  // (island, tokens)
  // Takes the contributions that change nothing out of `entries` (see rounds_commit.cc).
  Dropped TakeVoid(const CommitJob& job, std::vector<CommitEntry>& entries,
                   std::vector<std::string>& events) const;
  // The aggregate of `entries` stepped (under the data lock), leaving out, one by one, those whose
  // combination would make the parameters non-finite (largest norm first; they leave `entries`).
  std::optional<CommitResult> AggregateAndStep(ServiceFragment& f, CommitJob& job,
                                               std::vector<CommitEntry>& entries, Dropped& dropped,
                                               std::vector<std::string>& events);

  // outer.scoring (outer/service/rounds_scoring.cc): the on-time entries probed and judged, the
  // excluded ones moved to `dropped`, the others' weights scaled by their standing. Under the
  // data lock, before the fold.
  ScoreReport ScoreEntries(const ServiceFragment& f, const CommitJob& job,
                           std::vector<CommitEntry>& entries, Dropped& dropped,
                           std::vector<std::string>& events);
  // outer.step_guard: whether the round commits the plain average of its fold g and restarts the
  // outer momentum instead of the optimizer's step: the step would leave the held-out loss beyond
  // the guard above the average's (the probe's figures into `scores`), or the scoring left out
  // islands the last commit folded in (`purged`), whose contributions the momentum carries (see
  // rounds_scoring.cc). If so the fragment's next step is that average. Under the data lock.
  bool GuardsTheStep(ServiceFragment& f, const CommitJob& job, const float* g,
                     const std::vector<std::string>& purged, ScoreReport* scores,
                     std::vector<std::string>& events);
  std::map<std::string, double> AverageWeights(const CommitJob& job, uint64_t n,
                                               const std::vector<CommitEntry>& entries) const;

  // ---- pushes (outer/service/rounds_push.cc)
  absl::StatusOr<std::unique_ptr<PushStream>> OpenPushChecked(const pb::PushRequest& first);
  absl::StatusOr<pb::PushResponse> FinishPushChecked(std::unique_ptr<PushStream> stream);
  void NoteRefused(const PayloadId& id, uint64_t first_offset, uint64_t tokens,
                   const absl::Status& why);
  // The cheap checks of a push, at its start and again before it is recorded.
  absl::Status CheckPushLocked(const PayloadId& id) const;
  // Sync: AlreadyExists for a round of the island's this service has recorded already.
  absl::Status CheckNotRecordedLocked(const PayloadId& id) const;
  // Sync: the round a contribution arriving now joins (the open one; the next while one commits),
  // and the checks of one that comes after its own round: at most outer.max_staleness rounds, one
  // waiting per island and fragment.
  uint64_t OpenRoundLocked(const ServiceFragment& f) const;
  absl::Status CheckLateLocked(const ServiceFragment& frag, const PayloadId& id) const;
  // An update awaited from the round a resumed service opened, by a member of which it holds
  // nothing for the range: ABORTED (SyncServer::AwaitUpdate).
  absl::Status CheckPushKeptLocked(const pb::UpdateRequest& request, uint32_t fid) const;
  pb::PushResponse RecordLateLocked(const PayloadId& id, Contribution c);
  // The run's tokens so far and whether they reached its budget (async; sync ending at its tokens).
  void SetRunTokensLocked(pb::PushResponse& response) const;
  absl::Status CheckAsyncLocked(const ServiceFragment& f, uint32_t fragment,
                                const std::string& island, uint64_t base) const;
  // The inner steps a contribution may claim (see CheckClaimLocked), and the tokens of `steps`
  // on the island's declared data-parallel ranks.
  uint64_t ClaimStepsLocked(const PayloadId& id) const;
  uint64_t TokensBoundLocked(const PayloadId& id, uint64_t steps) const;
  // Refuses a contribution claiming more tokens than its round allows the island (see
  // SyncServerOptions::tokens_per_step).
  absl::Status CheckClaimLocked(const PayloadId& id, uint64_t tokens) const;
  // Sync, ending at its steps: refuses a push made past the run's last inner step.
  absl::Status CheckStepLocked(const PayloadId& id, uint64_t step) const;
  // A recorded contribution's weight in its round's mean: its tokens, at most one round's of its
  // island (a larger claim is flagged).
  uint64_t WeightLocked(const PayloadId& id, uint64_t tokens);
  // Notes an accepted contribution of `tokens` (the bound on later claims, the flag below).
  void NoteContributedLocked(const PayloadId& id, uint64_t tokens, uint64_t step);
  // Flags (counts, and logs at a bounded rate) a member whose claims since it joined exceed
  // kClaimFlagFactor times what its reported throughput could have trained in that time: a claim
  // the round's bound lets through when the island's declared data-parallel ranks are false.
  void FlagClaimLocked(Member& m, absl::Time now);
  void ClosePush(const PayloadId& id, uint64_t first_offset);
  void RememberRangesLocked(ServiceFragment& f,
                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  // Adds a verified stream to the island's contribution; returns the complete contribution when
  // this stream completed it.
  absl::StatusOr<std::optional<Contribution>> AddToPartialLocked(const PayloadId& id,
                                                                 EncodedPayload payload,
                                                                 uint64_t tokens,
                                                                 double sum_squares);
  // The bounds on a whole contribution's values and norm.
  absl::Status CheckValues(const PayloadId& id, const PayloadStats& stats) const;
  absl::Status CheckNormLocked(const PayloadId& id, const Contribution& c) const;
  // Async: a rank whose part did not complete its island's contribution waits for the rank that
  // does, and answers what it was answered.
  absl::StatusOr<pb::PushResponse> AwaitAppliedLocked(std::unique_lock<std::mutex>& lock,
                                                      const PayloadId& id);
  // Sync: the contribution waits for its round (and may complete it: then the caller runs the
  // commit once mu is released). Async: it is applied at once, outside mu.
  absl::StatusOr<pb::PushResponse> RecordLocked(const PayloadId& id, Contribution c,
                                                std::vector<CommitJob>& jobs);
  absl::StatusOr<pb::PushResponse> ApplyAsync(const PayloadId& id, Contribution c,
                                              double steps_per_s);
  // Async, under mu: a contribution of no tokens or no change, recorded and answered unapplied.
  pb::PushResponse VoidAsyncLocked(const PayloadId& id, const Contribution& c, uint64_t staleness);
  // Async, under mu: the answer to a contribution taken (applied by `contributors` 1, or void),
  // kept for a retry of the same push.
  pb::PushResponse AnswerAsyncLocked(const PayloadId& id, uint64_t staleness, uint32_t contributors);
  uint32_t SyncEveryLocked(const std::string& island) const;
  // Sync with auto-tune: records the island's figures and tells it the tau to use from now on.
  void TuneLocked(const std::string& island, const IslandFigures& figures,
                  pb::PushResponse& response);
  void StartTuner();

  // ---- commits (outer/service/rounds_commit.cc)
  bool ReadyLocked(const ServiceFragment& f, absl::Time now) const;
  // The steps of round `round` of a fragment on the run's schedule (0: before the first).
  int64_t RoundStepsLocked(uint32_t fragment, uint64_t round) const;
  // Aggregates the round's contributions and applies them (under the fragment's data lock);
  // contributions whose combination would make the parameters non-finite are left out one by one
  // (largest norm first).
  void RunCommit(CommitJob job);
  // Under the data lock: sets the fragment's outer step for round `round` (a warm start's average
  // or the scheduled learning rate), a function of the round alone. Async: of `async` alone
  // (AsyncStep: the island's step and the run's progress).
  void SetStepLocked(ServiceFragment& f, uint32_t fragment, uint64_t round,
                     AsyncStep async = {}) const;
  // The round's outer gradient: dense (the fragment's n values) or sparse (a linear step over
  // sparse contributions: the commit then costs what the round changed).
  struct Gradient {
    const float* dense = nullptr;
    const SparseGradient* sparse = nullptr;
  };
  // The round's fold of `refs` into g (under the data lock, after SetStepLocked): sparse where a
  // linear step takes it so, else dense into the fragment's one accumulator.
  absl::Status FoldLocked(ServiceFragment& f, const std::vector<ContributionRef>& refs,
                          AggregationReport* report, Gradient* g);
  // Under the data lock, after SetStepLocked: the update of the outer gradient g, applied
  // (INVALID_ARGUMENT and nothing changed when it would make a parameter non-finite), with the
  // hashes and norm after it. The update is relayed when the step is linear and relaying is
  // smaller (RelayIsSmaller).
  absl::StatusOr<CommitResult> StepLocked(ServiceFragment& f, uint32_t fragment, uint64_t round,
                                          Gradient g,
                                          const std::set<std::pair<uint64_t, uint64_t>>& ranges,
                                          Relayable relayable, SpareChunkData* spare);
  // The hashes and norm of the parameters (under the data lock; the ranges' hashes are tracked
  // from now on).
  void MeasureLocked(ServiceFragment& f, const std::set<std::pair<uint64_t, uint64_t>>& ranges,
                     CommitResult& result);
  // Under mu: logs the round and releases it to the islands.
  void PublishLocked(uint32_t fragment, CommitResult result, absl::Time now);
  size_t kept_versions() const;
  // Sync: drops a fragment's oldest committed rounds while more than `keep` are kept and their
  // encoded updates (with `extra_bytes` to come) exceed the fragment's budget for them.
  void TrimCommittedLocked(ServiceFragment& f, size_t keep, uint64_t extra_bytes);
  // Under mu: drops a fragment's oldest committed round; when nothing else holds it, its update's
  // buffers are kept for the next commit (up to a byte per parameter).
  void RetireOldestLocked(ServiceFragment& f);
  // Sync: the bytes of encoded updates a fragment keeps for islands catching up.
  static uint64_t CommittedBudgetBytes(const ServiceFragment& f);
  // Under mu, after a commit: when no round will retire before the next commit (sparse rounds are
  // kept for late islands), buffers like the newest update's are written in the background, so
  // that the next commit encodes into mapped memory (see WrittenBuffers).
  void WarmSpareLocked(uint32_t fragment);

  // Whether commits may fold contributions sparsely (sync, sparse, a mean rule; with a linear
  // step), so that a push keeps its kept values decoded for that fold.
  bool MayFoldSparsely() const;
  // The bound on decoded kept values held at once: the parameters' fp32 bytes, all fragments.
  static uint64_t KeptBudgetBytes(const ServiceCore& core);

  ServiceCore& core_;
  KeptBudget kept_budget_;  // for the decoded kept values of pushes (MayFoldSparsely)
  // Committed contributions' buffers for the next pushes, up to one round's sparse contributions.
  BufferPool push_buffers_;
  static uint64_t RoundContributionBytes(const ServiceCore& core);
  const uint64_t copy_seed_;  // draws the windows WeighCopies compares; unknown to the peers
  uint64_t CopySeed(const CommitJob& job) const {
    return copy_seed_ ^ (job.round * 0x9E3779B97F4A7C15ULL + job.fragment);
  }
  std::unique_ptr<TauTuner> tuner_;            // sync with auto-tune
  std::map<std::string, double> steps_per_s_;  // async: reported inner throughput, by island
  std::set<std::tuple<std::string, uint32_t, uint64_t>> open_pushes_;  // (island, fragment, offset)
  std::function<void(uint32_t)> commit_hook_;
  // Under mu: by island name and fragment, the newest inner step and the round after the newest
  // round of the island's recorded contributions (at most kMaxDoneIslands names are kept): a
  // push of a round at or before it is one the service has (its answer was lost), never a
  // contribution to fold again.
  struct Done {
    uint64_t step = 0;
    uint64_t rounds = 0;  // the newest recorded round + 1
  };
  static constexpr size_t kMaxDoneIslands = 4096;
  std::map<std::string, std::vector<Done>> done_;
  BackgroundQueue background_;  // last: its tasks use the members above until it is destroyed
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_ROUNDS_H_
