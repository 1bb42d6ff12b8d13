// The island's side of moment averaging (outer.moment_sync_every; the service's is
// outer/service/moment_desk.h): at a fragment's moment rounds its moments are pushed before the
// round's pseudo-gradient and the service's average taken once the round has committed; a joiner
// with fresh moments takes the run's newest average. A moment transfer that fails never fails the
// round: the island keeps its own moments and says why.
#ifndef ATOLL_OUTER_ISLAND_MOMENT_SYNC_H_
#define ATOLL_OUTER_ISLAND_MOMENT_SYNC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/island/island_sync.h"

namespace atl::outer {

class IslandModel;

// What goes with one round's push: the optimizer's moments of the fragment (optimizer "": none).
struct MomentPush {
  std::string optimizer;
  std::vector<float> values;
  uint64_t round = 0;
};

// The moments to push with the fragment's next round (taken on the training thread), when it is
// a moment round of `every` (0: never) and not a warm-start average.
MomentPush MomentsToPush(IslandModel& model, const IslandSync& sync, uint32_t every,
                         bool averaging);

// The round `round` runs, with `moments` pushed before it and their average fetched after it
// (RoundOutcome::moments, or moment_note saying why not).
absl::StatusOr<RoundOutcome> WithMoments(IslandSync& sync, const MomentPush& moments,
                                         uint64_t step,
                                         const std::function<absl::StatusOr<RoundOutcome>()>& round);

// A landed round's average loaded into the model (true), or `say` told why it has none. An
// average of honest islands is no larger than the largest of their moments: one whose norm, in
// either channel, is more than kMomentBound times this island's own (a hostile island's push
// inflated it) is not loaded; the island keeps its own.
inline constexpr double kMomentBound = 4.0;
bool LoadLandedMoments(IslandModel& model, uint32_t fragment, const RoundOutcome& outcome,
                       const std::function<void(const std::string&)>& say);

// A joiner: each carried fragment's newest average loaded, when the model's moments are fresh.
// Returns the fragments loaded; `say` is told of a fetch that failed (none averaged yet is no
// failure: the joiner then starts from zeros, as the run's first islands did).
int TakeNewestMoments(IslandModel& model, const std::vector<IslandSync*>& syncs, uint32_t every,
                      const std::function<void(const std::string&)>& say);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_MOMENT_SYNC_H_
