// How long a sync round waits, once it has its quorum (outer.min_islands), for the members that
// have not pushed yet: outer.grace. What arrives after the window is a late contribution, folded
// into the next round (outer.max_staleness, outer/service/rounds.h).
//
// "adaptive" follows the run's own arrival times, per fragment: the window is what the recent
// complete rounds' last arrivals took after their quorum, relative to the round's period (the time
// between two rounds' quorums, so that a run's one-step warm-start rounds teach the window for its
// H-step rounds), at its median plus k = 3 median absolute deviations (the robust centre and
// spread: the rule hivemind's and torchft's users ask for instead of hand-set timeouts), plus a
// quarter of the period, and at least kGraceFloorSeconds. The history is of rounds of one length
// (in steps): when the schedule's phase changes (the warm start's one-step rounds, then H steps)
// the service starts it again, since a straggler's delay relative to the period is not the same
// in rounds of another length; while it holds fewer than kGraceMinRounds complete rounds the
// round waits for the fixed deadline. The quarter period is the slack for what the history does
// not show (the phase an overlapped, tau > 0, or restarted island runs at).
// The window cuts what is unusual for the run: a transient straggler, a paused island. An island
// that is consistently slower makes the spreads it learns from: it is waited for (its pushes
// would otherwise be stale every round); such a run ends at its tokens with dynamic local steps
// instead (outer.run_end, outer/island/round_policy.cc). The first round (no period yet; it waits
// for the run's islands to start) waits outer.round_timeout_s, as "off" always does. A number of
// seconds is a fixed window.
//
// Pure logic (absl only): the service keeps one ArrivalHistory per fragment.
#ifndef ATOLL_OUTER_BASE_GRACE_H_
#define ATOLL_OUTER_BASE_GRACE_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace atl::outer {

struct GraceSpec {
  enum class Mode { kOff, kAdaptive, kSeconds };
  Mode mode = Mode::kAdaptive;
  double seconds = 0;  // kSeconds: the window
  bool operator==(const GraceSpec& o) const { return mode == o.mode && seconds == o.seconds; }
};
// "adaptive", "off", or seconds >= 0 ("2.5").
absl::Status ParseConfigValue(const std::string& text, GraceSpec* value);
std::string ConfigValueText(const GraceSpec& value);

inline constexpr double kGraceK = 3.0;
inline constexpr double kGraceSlack = 0.25;  // of the round period
inline constexpr double kGraceFloorSeconds = 1.0;
inline constexpr size_t kGraceMinRounds = 3;
inline constexpr size_t kGraceHistory = 20;

// The recent complete rounds of one fragment: how long after its quorum the round's last member
// arrived, over the round's period (the time since the previous round's quorum).
class ArrivalHistory {
 public:
  void Add(double spread_s, double period_s);
  // The window for a round of period `period_s` under `spec`; nullopt: none (the round waits for
  // outer.round_timeout_s): "off", or "adaptive" without a period or kGraceMinRounds rounds.
  // At least `floor_s` (kGraceFloorSeconds unless a test asks for less).
  std::optional<double> Window(const GraceSpec& spec, double period_s,
                               double floor_s = kGraceFloorSeconds) const;
  size_t size() const { return ratios_.size(); }
  void Clear() { ratios_.clear(); }

 private:
  std::deque<double> ratios_;  // newest last, at most kGraceHistory
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_GRACE_H_
