// `atoll local --chaos SPEC`: failures at random times drawn from a seed, for a whole run, and the
// run's goodput under them: tokens that reached the global model / tokens the same run trains
// without failures.
#ifndef ATOLL_SRC_CLI_CHAOS_H_
#define ATOLL_SRC_CLI_CHAOS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/service/token_ledger.h"

namespace atl {

enum class ChaosKind {
  kKill,  // SIGKILL an island; it restarts from its newest checkpoint `down_s` later
  kStop,  // SIGSTOP an island (every rank) for `down_s`: past its lease it is dropped and rejoins
};

struct ChaosSpec {
  uint64_t seed = 1;
  double every_s = 30;  // mean time between failures (exponentially distributed)
  std::vector<ChaosKind> kinds = {ChaosKind::kKill, ChaosKind::kStop};
  double down_s = 10;   // how long a failed island stays down
  // A failure-free run of the same command (`atoll local --run-dir DIR`): the report gives the
  // loss against its (island0's summary.json's val_loss).
  std::string reference;
};

// "seed=7,every=30,kinds=kill+stop,down=10,reference=DIR" (every key optional). Errors name the
// part.
absl::StatusOr<ChaosSpec> ParseChaos(const std::string& text);

// The failures of a run, the same for the same seed and islands: the k-th comes every_s x an
// exponential draw after the previous, on a uniformly drawn island, of a uniformly drawn kind.
class ChaosPlan {
 public:
  struct Failure {
    double at_s;  // since the first commit
    int island;
    ChaosKind kind;
  };
  ChaosPlan(const ChaosSpec& spec, int islands);
  Failure Next();

 private:
  ChaosSpec spec_;
  int islands_;
  std::mt19937_64 rng_;
  double t_ = 0;
};

struct GoodputReport {
  // Over fragment 0's rounds that changed the model (each step's tokens once): a round that
  // committed a zero update, and contributions that carried no work, count none.
  uint64_t tokens_committed = 0;
  uint64_t tokens_expected = 0;   // islands x steps x tokens per step and island
  uint64_t rounds = 0;            // fragment 0's
  uint64_t rounds_short = 0;      // committed without every island
  int failures = 0;
  std::vector<double> rejoin_s;   // from each island's recovery to its join
  int finished = 0;               // islands that reached the last step (a victim that came back
                                  // after the others ended the run does not)
  bool identical = false;         // every island that finished ended on the same parameters
  // Where the islands' tokens went, summed over them (the coordinator's token ledger, from the
  // `ledger` of rounds.jsonl's records): trained, committed on time or stale, refused, recomputed.
  outer::TokenAccount tokens;
  // The run's final val_loss (island0's), and the failure-free run's (ChaosSpec::reference).
  std::optional<double> val_loss, reference_val_loss;
  // The final val_loss over the failure-free run's, less 1 (0 without both).
  double loss_change() const {
    return val_loss && reference_val_loss && *reference_val_loss > 0
               ? *val_loss / *reference_val_loss - 1
               : 0;
  }
  double goodput() const {
    return tokens_expected > 0 ? double(tokens_committed) / double(tokens_expected) : 0;
  }
  std::string Text() const;
  std::string Json() const;
};

// Counts fragment 0's rounds of a coordinator's rounds.jsonl into `report`.
absl::Status CountRounds(const std::string& rounds_jsonl, int islands, GoodputReport* report);

// The island processes a chaos run acts on (`atoll local`'s).
class ChaosTarget {
 public:
  virtual ~ChaosTarget() = default;
  // Whether the island runs (and no failure has ended it).
  virtual bool Running(const std::string& island) = 0;
  // To every process of the island. SIGKILL also marks its end as expected.
  virtual void Signal(const std::string& island, int sig) = 0;
  // Starts it again (from its newest checkpoint, if any).
  virtual absl::Status Restart(const std::string& island) = 0;
  virtual void Say(const std::string& line) = 0;
};

// Fires a ChaosPlan's failures at a run from its first commit until an island has done four
// fifths of its steps (an island that fails can still come back before the others end the run
// without it), brings each island back `down_s` later, and follows the processes' lines for the
// report.
class Chaos {
 public:
  Chaos(const ChaosSpec& spec, int islands);
  // `now_s`: the run's clock; `committed`: rounds so far.
  absl::Status Tick(double now_s, uint64_t committed, ChaosTarget& target);
  void OnCoordinatorLine(const std::string& line, double now_s, ChaosTarget& target);
  void OnIslandLine(const std::string& island, const std::string& line);
  // Failed islands still to come back: the run is not over before they are.
  bool recovering() const { return !recoveries_.empty(); }
  // An island a failure hit that then ended in error once the coordinator had ended the run: it
  // came back to find no service, which is not a failure of the run.
  bool Casualty(const std::string& island) const { return run_over_ && victims_.count(island) > 0; }
  // `rounds_jsonl`: the coordinator's; `tokens_expected`: without failures; `run_dir`: the run's
  // (island0's last summary gives its val_loss).
  absl::StatusOr<GoodputReport> Report(const std::string& rounds_jsonl, uint64_t tokens_expected,
                                       const std::string& run_dir);

 private:
  struct Recovery {
    double at_s;
    std::string island;
    ChaosKind kind;
  };
  void Fail(const ChaosPlan::Failure& f, double now_s, ChaosTarget& target);

  ChaosSpec spec_;
  int islands_;
  ChaosPlan plan_;
  std::optional<ChaosPlan::Failure> next_;
  double start_s_ = -1;                          // the first commit
  std::vector<Recovery> recoveries_;
  std::map<std::string, double> recovered_;     // island -> when it came back, until it joins
  std::map<std::string, std::string> final_hashes_;  // island -> its last global params hash
  std::set<std::string> victims_;
  bool finishing_ = false;
  bool run_over_ = false;                        // the coordinator has ended the run
  GoodputReport report_;
};

}  // namespace atl

#endif  // ATOLL_SRC_CLI_CHAOS_H_
