// Rounds: when a round is ready to commit: every member it waits for has contributed, or its
// quorum has and its grace window or deadline has passed (late work alone only in a run's last
// rounds); how long each round of the schedule is; and the hand-over of ready rounds to their
// commits (outer/service/rounds_commit.cc).
#include <algorithm>
#include <utility>
#include <vector>

#include "outer/service/rounds.h"

namespace atl::outer {

bool Rounds::AllArrivedLocked(const ServiceFragment& f) const {
  // Before its deadline a round needs every member; the first round also waits for the run's full
  // complement of islands, so an island that is merely slower to start takes part from the start.
  const uint32_t fragment = uint32_t(&f - core_.fragments.data());
  const uint64_t first = fragment < core_.first_rounds.size() ? core_.first_rounds[fragment] : 0;
  bool all = f.round > first || core_.complement_reached;
  // A member that has finished (it waits for the others to end the run), or that pushed the
  // fragment after the run's last step, pushes no more rounds of it: an island that trains on
  // after it (it owes the steps it was away for) commits those alone.
  // (A run that ends at its tokens has no last step: islands train on until it does.)
  const uint64_t last = core_.options.async || core_.options.token_budget > 0
                            ? UINT64_MAX
                            : core_.options.total_inner_steps;
  for (const auto& [id, m] : core_.membership.members()) {
    if (!m.finished && Membership::Required(m, fragment, f.round) &&
        (last == 0 || DoneStepLocked(id, fragment) < last)) {
      all &= f.contributions.count(id) > 0;
    }
  }
  return all;
}

int64_t Rounds::RoundStepsLocked(uint32_t fragment, uint64_t round) const {
  if (round == UINT64_MAX) return 0;  // before the first round
  const SyncSchedule schedule = core_.Schedule();
  return schedule.DueStep(int(fragment), round) - schedule.RoundStart(int(fragment), round);
}

bool Rounds::ReadyLocked(const ServiceFragment& f, absl::Time now) const {
  if (f.committing) return false;
  // Late contributions alone commit a round only when no member is to push to it (the run's last
  // rounds): they are not left behind.
  if (f.contributions.empty()) return !f.late.empty() && AllArrivedLocked(f);
  if (AllArrivedLocked(f)) return true;
  if (int(f.contributions.size()) < core_.options.min_islands) return false;
  return now >= f.deadline || now >= f.grace_deadline;
}

void Rounds::OpenGraceLocked(ServiceFragment& f, absl::Time now) {
  f.quorum_at = now;
  if (core_.options.async) return;
  // The first round of a new length has no history of its own (TakeReadyLocked keeps it).
  const uint32_t fragment = uint32_t(&f - core_.fragments.data());
  if (RoundStepsLocked(fragment, f.round) != RoundStepsLocked(fragment, f.round - 1)) {
    f.arrivals.Clear();
  }
  const double period = f.previous_quorum_at == absl::InfinitePast()
                            ? 0
                            : absl::ToDoubleSeconds(now - f.previous_quorum_at);
  const std::optional<double> window =
      f.arrivals.Window(core_.options.grace, period, core_.options.grace_floor_s);
  if (!window) return;
  f.grace_s = std::min(*window, core_.options.round_timeout_s);
  f.grace_deadline = now + absl::Seconds(f.grace_s);
}

std::vector<Rounds::CommitJob> Rounds::TakeReadyLocked(absl::Time now) {
  std::vector<CommitJob> jobs;
  for (uint32_t i = 0; i < core_.fragments.size(); ++i) {
    ServiceFragment& f = core_.fragments[i];
    if (!ReadyLocked(f, now)) continue;
    // A round every member reached teaches the grace window how long the last ones take (not the
    // first round: it waits for the run's islands to start), among rounds of its length: the
    // first round of a new length (a phase of the schedule) starts the history again.
    const uint64_t first = i < core_.first_rounds.size() ? core_.first_rounds[i] : 0;
    if (RoundStepsLocked(i, f.round) != RoundStepsLocked(i, f.round - 1)) {
      f.arrivals.Clear();
    } else if (f.round > first && AllArrivedLocked(f) && f.quorum_at != absl::InfinitePast() &&
               f.previous_quorum_at != absl::InfinitePast()) {
      f.arrivals.Add(absl::ToDoubleSeconds(f.last_arrival - f.quorum_at),
                     absl::ToDoubleSeconds(f.quorum_at - f.previous_quorum_at));
    }
    f.previous_quorum_at = f.quorum_at;
    f.quorum_at = absl::InfinitePast();
    f.grace_deadline = absl::InfiniteFuture();
    CommitJob job;
    job.grace_s = f.grace_s;
    f.grace_s = -1;
    job.fragment = i;
    job.round = f.round;
    job.contributions = std::move(f.contributions);
    job.late = std::move(f.late);
    job.params_norm = f.params_norm;
    job.known_ranges = f.known_ranges;
    job.opened = f.opened;
    f.contributions.clear();
    f.late.clear();
    f.partials.clear();  // parts of islands that did not complete theirs in time
    f.deadline = absl::InfiniteFuture();
    f.committing = true;
    // Every member this round waited for has applied the rounds before it: a big fragment's
    // newest update goes before the next one is made, not after (see kMinCommittedKept).
    TrimCommittedLocked(f, 0, f.committed.empty() ? 0 : f.committed.back()->update_bytes);
    job.spare = std::exchange(f.spare_chunks, {});
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void Rounds::RunCommits(std::vector<CommitJob> jobs) {
  for (auto& job : jobs) RunCommit(std::move(job));
}

}  // namespace atl::outer
