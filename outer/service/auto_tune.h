// `outer.auto_tune`: the service chooses tau (the inner steps between a fragment's push and its
// merge) from what the islands measure, with the planner's replay of the run (outer/base/planner.h):
// the smallest tau whose predicted compute utilization reaches the target (the freshest updates
// that keep the islands busy), else the tau that predicts the most. Each island reports its inner
// throughput and the goodput of its link to the service (measured on its state fetch when it
// joins, a transfer of the whole model over the real channel) with every push; the choice follows
// the slowest island and the slowest link, and changes when they move by more than a quarter.
// It plans with headroom: as if transfers took `headroom` times as long as measured, because step
// times jitter and islands are not alike, so that a round trip that just fits in tau steps on
// paper is not late half the time in practice.
//
// Threading: none; the service calls it under its lock.
#ifndef ATOLL_OUTER_SERVICE_AUTO_TUNE_H_
#define ATOLL_OUTER_SERVICE_AUTO_TUNE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "outer/base/planner.h"

namespace atl::outer {

// What an island reports with a push (0: not measured).
struct IslandFigures {
  double steps_per_s = 0;
  double link_bps = 0;
};

// Finite, not negative, below absurd bounds; names the offending figure.
absl::Status ValidateFigures(const IslandFigures& f);

struct TauChoice {
  int tau = 0;
  double predicted = 0;       // utilization at that tau
  double predicted_tau0 = 0;  // utilization blocking (tau = 0)
  double step_time_s = 0, link_bps = 0;  // the inputs planned with: slowest island, slowest link
};

// Over tau in [0, H): the smallest reaching `target`, else the smallest as good as any; O(log H)
// replays.
TauChoice ChooseTau(PlanInput run, double target);

class TauTuner {
 public:
  // `run`: the run's fragments, H, codec, islands; its step time and link are replaced.
  TauTuner(PlanInput run, double target, double headroom = 1);

  // Records an island's figures; returns the new choice when it is the first or the inputs moved.
  std::optional<TauChoice> Report(const std::string& island, const IslandFigures& figures);
  void Forget(const std::string& island);
  // The current choice (none until an island reported both figures).
  std::optional<int> tau() const;

 private:
  PlanInput run_;
  double target_, headroom_;
  double measured_link_bps_ = 0;  // of the current choice, before the headroom
  std::map<std::string, IslandFigures> figures_;
  std::optional<TauChoice> choice_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_AUTO_TUNE_H_
