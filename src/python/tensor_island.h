// An island of a DiLoCo run around parameters that atoll does not own: a user's PyTorch module,
// trained by the user's own loop (src/python/module.cc binds it as atoll.Island). The user calls
// Step after each inner optimizer step; everything outer is atoll's own, unchanged: the session
// (join, heartbeats, rejoin, leave: outer/island/island_session.h) and the outer step (fragments,
// codecs and error feedback, tau and alpha, eager updates, sync and async: outer/island/
// outer_step.h), over gRPC, with the same hash checks as `atoll island`.
//
// The module's parameters map onto the run's fragments by name (JoinResponse.fragments). A module
// atoll does not build joins a run whose coordinator serves that module (ModuleParams: its
// LayoutHash, every parameter row-major); a module that holds atoll's own model (`atoll_model`:
// the names and shapes of `atoll export --names atoll`) joins any run of that [model], with
// `atoll island`s, in atoll's canonical flat order.
//
// Threading: every method may be called from any thread; they take turns (a call waits while
// another, e.g. a Step waiting for a round, runs). The heartbeats and pushes run on atoll's own
// threads and never touch the module.
#ifndef ATOLL_SRC_PYTHON_TENSOR_ISLAND_H_
#define ATOLL_SRC_PYTHON_TENSOR_ISLAND_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/island/outer_step.h"
#include "src/config/config.h"
#include "src/net/rpc_security.h"
#include "src/python/host_params.h"

namespace atl::python {

// What a checkpoint keeps of an island's outer state, beside the user's own state_dict: where it
// stood (its step and tokens), the rounds and hashes of its copies of the global parameters, and
// what error feedback had not yet sent. The global parameters themselves come from the service on
// a resume (as for `atoll island --resume`), checked against its hashes.
struct IslandState {
  int64_t step = 0;
  uint64_t tokens = 0;
  std::vector<uint64_t> rounds;  // per fragment
  std::vector<uint64_t> global_hashes;
  std::vector<outer::OuterStepHook::Residual> residuals;
};

struct TensorIslandOptions {
  Config config;             // [outer] (and [model] with atoll_model); [train].seed for rounding
  bool atoll_model = false;  // the parameters are atoll's model of config.model, by atoll's names
  std::string coordinator;   // HOST:PORT
  std::string token;         // the run token ("" without)
  TlsFiles tls;
  std::string name;          // the island's name in the run
  // Where the session credential is kept (a restarted island ends its old membership with it);
  // empty: not kept.
  std::string credential_file;
  std::optional<IslandState> resume;  // a checkpoint's outer state
  FILE* out = stderr;                 // the island's lines (nullptr: quiet)
  // Asked while the island retries the service or waits for its peers or a round: not OK ends the
  // wait with it (Python's Ctrl-C; the island is then interrupted). Null: never.
  std::function<absl::Status()> interrupted;
};

// A GPU module's parameters are read and written through host mirrors the Python side keeps:
// before the island reads parameters (indices into the module's list) `to_host` copies them into
// their mirrors, after it wrote them `from_host` copies them back. Null for host tensors (read and
// written in place). Called on the thread of the island's call.
struct MirrorCopies {
  std::function<absl::Status(const std::vector<size_t>&)> to_host;
  std::function<absl::Status(const std::vector<size_t>&)> from_host;
};

// A merged round, as Python sees it.
struct LandedRoundRecord {
  uint32_t fragment = 0;
  uint64_t round = 0;    // sync: the round merged
  uint64_t version = 0;  // async: the version of the global copy after it
  int64_t pushed_at = 0, step = 0;
  uint64_t global_hash = 0;
  uint32_t contributors = 0;
  bool resynced = false;
};

class TensorIsland {
 public:
  // Joins the run, maps the parameters onto its fragments, loads (or hash-checks) the global
  // parameters into them and starts the heartbeats. `params`: the module's, in its order.
  static absl::StatusOr<std::unique_ptr<TensorIsland>> Join(TensorIslandOptions options,
                                                             std::vector<HostParam> params,
                                                             MirrorCopies mirrors = {});
  ~TensorIsland();

  // After one inner optimizer step that trained `tokens` tokens (`loss`, when given, goes to the
  // service's status page): lands what is due, pushes what is due. False once the island is done:
  // its last step was trained (the parameters then hold the run's final global parameters: it
  // waited for the others, as `atoll island` does), or `stop` was set (SIGTERM: it pushed what it
  // trained since its last push and left).
  // An interrupted Step (its wait for a round) returns the interruption's status; every later
  // Step is refused (FAILED_PRECONDITION) and Close leaves without waiting.
  absl::StatusOr<bool> Step(uint64_t tokens, std::optional<double> loss, bool stop);
  // Asks the island to leave (SIGTERM): a Step waiting for a round then leaves at once and returns
  // false (what it trained is pushed). Safe from any thread at any time, a waiting Step's too.
  void RequestStop();
  // Leaves the run (idempotent). An island that is not done pushes what it trained first; an
  // interrupted one leaves at once (IslandRuntime::Abandon: the rounds in flight are not merged).
  absl::Status Close();

  IslandState State() const;
  int64_t step() const;
  uint64_t tokens() const;
  bool done() const;
  bool async() const;
  int64_t max_steps() const;         // the run's steps for this island (async: an upper bound)
  int64_t run_progress() const;      // async: the run's position, for the learning-rate schedule
  uint32_t num_fragments() const;
  std::vector<std::vector<std::string>> fragment_parameters() const;
  std::vector<uint64_t> fragment_hashes() const;
  std::vector<uint64_t> rounds() const;  // each fragment's open round
  std::string island_id() const;
  std::string Describe() const;          // "H = 50, 2 fragment(s), tau = 2, alpha = 0.50, fp4_e2m1"
  outer::OuterStepStats stats() const;
  // The rounds merged so far (the newest 100,000).
  std::vector<LandedRoundRecord> landed() const;

 private:
  struct Impl;
  explicit TensorIsland(std::unique_ptr<Impl> impl);
  std::unique_lock<std::mutex> Turn() const;  // the calls take turns
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::python

#endif  // ATOLL_SRC_PYTHON_TENSOR_ISLAND_H_
