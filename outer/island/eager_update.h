// Eager updates for overlapped rounds (Kale, Douillard, Donchev, arXiv 2502.12996), on one
// island's share of one fragment. While a round's global update is in flight (tau > 0 inner steps)
// the island does not train on its own end-of-round parameters but on a stand-in for the update
// that will come: the last update it received with its own share of the average refreshed,
//   u_hat = u_prev + (gain / M) x (delta - delta_prev),   theta_hat = global - u_hat,
// where delta = global - local is its pseudo-gradient now, delta_prev the one it pushed last time,
// u_prev the global update of its last landed round, M that round's contributors (the run's
// islands before any), and gain the outer step per unit of the averaged pseudo-gradient (outer SGD
// or heavy ball: lr; Nesterov: lr x (1 + momentum)). The paper's stand-in for the average is
// Delta_prev + (delta - delta_prev) / M; through a linear outer step it is this u_hat. When the
// update lands, the stand-in is swapped for it and the inner steps since the push are kept:
//   theta <- theta + (global_new - theta_hat).
// Every island's global copy is untouched (bit-identical as ever): only the local parameters move.
// With one island and outer SGD of lr 1, u_prev = delta_prev and u_hat = delta: the island trains
// on as if it were alone, where the alpha merge would throw away (a share of) the tau steps.
//
// Pure fp32 vector math on the training thread; no torch, no network.
#ifndef ATOLL_OUTER_ISLAND_EAGER_UPDATE_H_
#define ATOLL_OUTER_ISLAND_EAGER_UPDATE_H_

#include <cstdint>
#include <vector>

#include "outer/base/outer_optimizer.h"

namespace atl::outer {

// The outer step per unit of the averaged pseudo-gradient of `config`'s optimizer at its base lr
// (the service's schedules, warmup and decay, are not followed).
double EagerGain(const OuterOptimizerConfig& config);

class EagerUpdate {
 public:
  EagerUpdate(double gain, uint32_t islands) : gain_(gain), contributors_(islands) {}

  // At the push of `local` (global: the round's start, the island's copy): the parameters to train
  // on until the round lands.
  std::vector<float> StandIn(const std::vector<float>& global, const std::vector<float>& local);
  // When the round lands (global_new: the island's copy after it; contributors: the round's):
  // `local` (the parameters trained since the push) becomes local + (global_new - stand_in).
  void Land(const std::vector<float>& global_new, uint32_t contributors, std::vector<float>& local);
  // The round will not land on the stand-in (the island loads the global parameters instead: a
  // resync, a rejoin, the run's end): what it knew of the last rounds is dropped.
  void Forget();
  bool in_flight() const { return !stand_in_.empty(); }

 private:
  double gain_;
  uint32_t contributors_;
  std::vector<float> last_update_, last_delta_;  // empty: none yet (zeros)
  std::vector<float> global_at_push_, stand_in_;  // of the round in flight
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_EAGER_UPDATE_H_
