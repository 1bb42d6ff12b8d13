// Contributions earn their weight: a well-formed, in-bounds pseudo-gradient can still be useless
// or harmful (sign-flipped, noise of the right norm, trained on garbage). With
// outer.scoring = "loss_probe" the service measures, for every contribution of a sync round, the
// loss on each row of a fixed held-out batch of the round's global parameters with that
// contribution alone applied (the island's own trained fragment), and keeps a reputation per
// island across rounds. Per row r, d_i[r] = loss(global)[r] - loss(global - delta_i)[r] (what
// island i's contribution buys there) and m[r] = the median over the round's islands of d_j[r]:
//
//   the round judges only when the median contribution measurably helps: the t statistic of m
//   over the rows is at least `significance` (late in a run, when every island buys little
//   against the batch's noise, nobody is judged, and nobody is readmitted either)
//   t_i          = mean_r(d_i - m) / (sd_r(d_i - m) / sqrt(R))     (paired against the median)
//   ratio_i      = gain_i / median_j(gain_j), gain_i = mean_r d_i[r]
//   score_i      = 1 when t_i >= -significance or ratio_i >= 1/2 (as good as the median within
//                  the batch's noise, or at least half as good), else ratio_i clamped to [-1, 1]
//   reputation_i <- decay x reputation_i + (1 - decay) x score_i                  (new islands: 1)
//   weight_i      = clamp((reputation_i - exclude_below) / (floor - exclude_below), 0, 1)
//   harmful_i     = score_i < 1 and t_i < -3 x significance: left out of this round whatever its
//                   reputation (a negated or garbage contribution does its harm in the round it
//                   lands; reputation alone would let it in at full weight for a round or two).
//                   Honest islands on micro reached t -6.9 at worst in 2,700 rounds; the
//                   rehearsed hostile roles reach -90 in the rounds they harm most
//                   (outer/README.md, "Hostile and broken peers")
//
// A contribution can help alone and still pull the round's average away from where the others
// agree: an island trained on shuffled tokens learns the byte frequencies as the honest ones do
// early on, and alone buys as much as they do, but the average with it stalls where the one
// without it goes on (outer/README.md). So the service also probes the combination, leave-one-out,
// over the islands in the round's average (on time, not excluded, copies weighing as one; at
// least 3):
//
//   c_i[r]        = loss(global - average without i)[r] - loss(global - average)[r]
//                   (what the round's token-weighted average loses on row r without island i)
//   evidence_i   <- decay x evidence_i + (1 - decay) x clamp(t of c_i over the rows, -8, 8)
//                   (rounds it is not in the average: decay x evidence_i)
//   evidence_i < -leave_one_out_t: harmful this round (left out), and in a round that judges its
//                   score is at most 0
//
// The clamp bounds what one round adds to 1.6: the evidence of an island that pulls apart beyond
// doubt in every round is -1.6, -2.9, -3.9, so it is left out from its third round, and no run of
// one or two bad rounds can do it. Honest islands' evidence stayed above -2.7 on micro over 3,600
// island-rounds, dense and sparse (their t: mean +0.3 to +1.8, spread 1.7 to 2.7, single rounds
// down to -24; outer/README.md); the rehearsed shuffled-tokens island reached -3.6 and -3.9 in its
// third round.
//
// Every t above is read at the probe size its thresholds were set on, 32 rows: a probe of R > 32
// rows (outer.probe_batches x train.batch_size) counts t x sqrt(32 / R), the t a 32-row probe
// shows of the same effect (the reports give these t's). A larger probe measures more finely, but
// the small, real differences between honest islands' data streams would grow with its rows to
// "beyond doubt": on 128 rows an honest island's evidence reached -3.19 in three rounds
// (outer/README.md). Fewer rows keep their t: fewer rows' t's have heavier tails.
//
// A contribution that buys nothing (zeros) scores 0 in every round that judges. An island whose
// reputation falls below exclude_below is excluded (weight 0, its contribution left out) for at
// least exclude_rounds of its judged rounds; it is still scored, and readmitted once its
// reputation is back at `floor`. The round never falls below its quorum: when exclusions would
// leave fewer than min_islands contributions, the best-reputed excluded ones are kept (at the
// least weight). Templar's validators score peers by the loss their updates buy, likewise. The
// probe itself needs the model: its implementation lives with the model (src/service).
#ifndef ATOLL_OUTER_BASE_SCORING_H_
#define ATOLL_OUTER_BASE_SCORING_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace atl::outer {

struct ScoringOptions {
  bool loss_probe = false;      // outer.scoring = "loss_probe"
  double decay = 0.8;           // outer.reputation_decay
  double floor = 0.5;           // outer.reputation_floor: full weight at or above
  double exclude_below = 0.2;   // outer.exclude_below
  uint32_t exclude_rounds = 5;  // outer.exclude_rounds
  double significance = 4;      // standard errors that make a round judge, and judge an island
  double leave_one_out_t = 3.5;  // outer.leave_one_out_t: the evidence that pulls apart (0: off)
  double step_guard = 0.1;  // outer.step_guard (outer/service/rounds_scoring.cc; 0: off)
};

// The held-out loss of each row of its batch (the mean over the row's tokens), for the model whose
// fragment `fragment` holds `params` (its n elements, in the fragment's flat order) and whose other
// fragments hold what was last given for them. Fixed batch, fixed order: the same parameters give
// the same losses.
class LossProbe {
 public:
  virtual ~LossProbe() = default;
  virtual absl::StatusOr<std::vector<double>> Losses(uint32_t fragment, const float* params,
                                                     uint64_t n) = 0;
  // The fragment's global parameters changed (a commit): the probe's model follows them.
  virtual void Set(uint32_t fragment, const float* params, uint64_t n) = 0;
};

// The mean of a probe's rows (0 for none): the held-out loss it reports.
double MeanOf(const std::vector<double>& rows);

// The probe size the rule's thresholds were set on (above).
inline constexpr size_t kReferenceRows = 32;

// The weight of an excluded island kept in to make the quorum.
inline constexpr double kQuorumWeight = 0.01;

struct IslandScore {
  double improvement = 0;  // held-out loss bought by its contribution alone (mean over rows)
  double t = 0;  // paired against the round's per-row median, at 32 rows (0: not scored)
  double score = 0;        // what the round said of it (above; 0: not scored)
  double reputation = 1;
  double weight = 1;       // multiplies its tokens in the fold
  bool excluded = false;   // left out of the round (by its reputation, or as harmful)
  bool harmful = false;    // this round found it harmful beyond doubt (above)
  bool pulls_apart = false;  // ... by its leave-one-out evidence (below -leave_one_out_t)
  // Leave-one-out (above): what the round's average loses without it (mean over rows; > 0: it
  // helps the combination), that difference's t over the rows at 32 rows (0: not probed), and the
  // evidence.
  double loo_gain = 0;
  double loo_t = 0;
  double loo_evidence = 0;
};

struct ScoreReport {
  double loss = 0;  // held-out loss of the round's global parameters
  // The step guard's (0: not probed): held-out loss with the round's plain average of the
  // contributions kept applied, and with the outer optimizer's step; whether the round committed
  // the average instead (and restarted the outer momentum).
  double average_loss = 0;
  double step_loss = 0;
  bool step_guarded = false;
  double median_t = 0;  // of the median contribution's gain, at 32 rows (judged: >= significance)
  double seconds = 0;  // the probes' time (part of the commit's)
  std::map<std::string, IslandScore> islands;
  bool scored() const { return !islands.empty(); }
};

// What a durable snapshot keeps of an island's standing (outer/service/state_store.h), so that a
// service that resumes does not let an excluded island back in at full weight.
struct SavedStanding {
  std::string island;
  double reputation = 1;
  uint64_t judged = 0;
  uint64_t excluded_until = 0;
  double loo_evidence = 0;
};

// Every island's reputation across rounds (all fragments). Thread-safe: fragments commit at once.
class Reputation {
 public:
  explicit Reputation(const ScoringOptions& options) : options_(options) {}

  // One round's per-row improvements d_i (by island; empty: the probe failed for it, judged as
  // harmful) in; each island's score, weight and exclusion out (in report->islands). `combined`:
  // c_i per row, of the islands in the round's average (empty: not probed). `quorum`: the least
  // number of islands left in.
  void Judge(const std::map<std::string, std::vector<double>>& improvements,
             const std::map<std::string, std::vector<double>>& combined, size_t quorum,
             ScoreReport* report);

  // An island's reputation, weight and exclusion now (unscored: a late contribution's).
  IslandScore Standing(const std::string& island) const;

  // Every island's standing, by name; and back. Restore replaces them all, or returns
  // DATA_LOSS naming the island and the value that no run of this rule can reach (a reputation
  // outside [-1, 1], evidence outside [-8, 8], not finite; an empty or repeated name; more than
  // kMaxSaved islands) and changes nothing.
  std::vector<SavedStanding> Save() const;
  absl::Status Restore(const std::vector<SavedStanding>& saved);
  static constexpr size_t kMaxSaved = 4096;

 private:
  struct Island {
    double reputation = 1;
    uint64_t judged = 0;           // rounds it was scored in
    uint64_t excluded_until = 0;   // its `judged` count before which it stays out (0: in)
    double loo_evidence = 0;
  };
  static constexpr double kMostPerRound = 8;  // |t| of c_i counted from one round
  // The island's leave-one-out evidence updated from this round's c_i (or its absence); whether
  // it pulls the average apart.
  bool PullsApart(Island& i, const std::vector<double>* c, size_t rows, double per_row,
                  IslandScore* s) const;
  double WeightOf(const Island& i) const;
  void Update(Island& i, double score);
  void KeepQuorum(size_t quorum, ScoreReport* report) const;

  const ScoringOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Island> islands_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_SCORING_H_
