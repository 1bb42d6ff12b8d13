// Everything an island does around its training steps, whoever trains it: `atoll island`
// (src/island/island_loop.cc) and a user's PyTorch loop (src/python/tensor_island.cc) drive this
// one runtime and re-assemble none of it.
//
//   Join    the session (retries, the kept credential of a restarted island, the run-mode check)
//   Start   the outer step over the island's model: the residuals a restarted island kept, the
//           global parameters fetched (or its seeded ones hash-checked), async islands waiting
//           for their peers, every rank ready, then the heartbeats
//   Finish  the last pushes and the wait for the others (or, stopped, the last steps pushed),
//           the last heartbeat, leaving
//
// Between Start and Finish the trainer calls hook().AfterStep after each inner step and tells the
// session its step and telemetry. A runtime destroyed before Finish leaves the run (its session
// does).
#ifndef ATOLL_OUTER_ISLAND_ISLAND_RUNTIME_H_
#define ATOLL_OUTER_ISLAND_ISLAND_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/outer_config.h"
#include "outer/island/island_session.h"
#include "outer/island/outer_step.h"

namespace atl::outer {

struct RuntimeOptions {
  OuterConfig outer;            // the island's [outer] section
  std::string name;             // its name in the run
  uint64_t model_hash = 0;      // what it presents for its model (SessionOptions::config_hash)
  // Its parameters' names and sizes, in order (a refusal for another model names the first that
  // differs); empty: not sent.
  std::vector<std::pair<std::string, uint64_t>> parameters;
  uint32_t data_parallel = 1;   // its data-parallel ranks
  std::string credential_file;  // SessionOptions::credential_file
  uint64_t seed = 0;            // train.seed: with the data stream, its stochastic rounding's seed
  std::function<void(const std::string&)> say;  // rank 0's words while it joins
  // Asked while it retries or waits for its peers (RetryPolicy::interrupted); null: never.
  std::function<absl::Status()> interrupted;
};

struct StartOptions {
  int64_t tokens_per_step = 0;  // of the island (all its data-parallel ranks); see IslandModel
  // A restarted island's error-feedback residuals, from its checkpoint.
  std::vector<OuterStepHook::Residual> residuals;
  bool resumed = false;
  // After the global parameters are loaded, before the heartbeats (e.g. the island's replicas
  // copy them).
  std::function<absl::Status()> after_fetch;
};

class IslandRuntime {
 public:
  // Joins as rank 0 of `ranks` (the others follow) and checks the run's mode against the
  // island's. `transport` and `ranks` outlive the runtime.
  static absl::StatusOr<std::unique_ptr<IslandRuntime>> Join(Transport& transport,
                                                             IslandRanks& ranks,
                                                             RuntimeOptions options);

  const pb::JoinResponse& joined() const { return session_->joined(); }
  bool async() const { return joined().schedule().async(); }
  IslandSession& session() { return *session_; }

  // Builds the outer step over `model` (its fragments' shares as this rank holds them) and puts
  // the island on the run; then the heartbeats start. `model` outlives the runtime.
  absl::Status Start(IslandModel& model, std::vector<FragmentShare> shares, StartOptions options);
  // After Start.
  OuterStepHook& hook() { return *hook_; }
  const OuterStepHook& hook() const { return *hook_; }
  double fetch_s() const { return fetch_s_; }

  // Ends the island's part of the run once (later calls return OK): the outer step's end, then
  // `before_leave` (evaluations, the last checkpoint; skipped when the outer step failed), the
  // last heartbeat with the island's final telemetry, leaving.
  absl::Status Finish(bool stopped, const std::function<absl::Status()>& before_leave = nullptr);
  bool finished() const { return finished_; }
  // Leaves without finishing (a failure); idempotent.
  void Leave() { session_->Leave(); }
  // Leaves without waiting (an island interrupted while it waited for a round): unless finished,
  // the membership ends; then every call still in flight (the outer step's pushes and waits for
  // rounds) ends at once and later ones are refused, so that nothing waits on the service. What
  // those rounds would have brought is not merged. Idempotent.
  void Abandon();

 private:
  IslandRuntime(Transport& transport, IslandRanks& ranks, RuntimeOptions options,
                std::unique_ptr<IslandSession> session);

  Transport& transport_;
  IslandRanks& ranks_;
  const RuntimeOptions options_;
  std::unique_ptr<IslandSession> session_;
  std::unique_ptr<OuterStepHook> hook_;
  double fetch_s_ = 0;
  bool finished_ = false;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_ISLAND_RUNTIME_H_
