// An island's membership of a run, seen from the island: join (with the run's retry policy),
// heartbeats from their own thread, rejoin after the service dropped it, leave. Transport-
// independent; one policy for every wait on a coordinator that is starting, restarting or busy.
//
// Threading: the heartbeat thread only renews the lease and records refusals; everything else
// runs on the thread that owns the session.
#ifndef ATOLL_OUTER_ISLAND_ISLAND_SESSION_H_
#define ATOLL_OUTER_ISLAND_ISLAND_SESSION_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/island/island_sync.h"
#include "outer/base/outer_config.h"
#include "outer/base/transport.h"

namespace atl::outer {

// How long and how often an island retries a call that failed for a passing reason: UNAVAILABLE
// (no coordinator, or it is restarting), RESOURCE_EXHAUSTED (no free data stream yet, or the
// service's call limits), after first_backoff_s, doubling to at most max_backoff_s, each wait
// with up to `jitter` x itself added at random so that islands do not retry in lockstep.
struct RetryPolicy {
  double timeout_s = 60;
  double first_backoff_s = 0.2;
  double max_backoff_s = 5;
  double jitter = 0.5;
  // Told what it waits for, at least every `say_every_s` while it retries: the last failure, the
  // seconds spent and the wait before the next try (empty: nothing said).
  std::function<void(const absl::Status& last, double elapsed_s, double next_s)> say;
  double say_every_s = 3;
  // Asked between tries and every 0.1 s of a wait: a status other than OK ends the retries with it
  // (a Python island's Ctrl-C). Null: never.
  std::function<absl::Status()> interrupted;
};

// Sleeps `seconds` in slices, ending early with the policy's interruption.
absl::Status SleepUnlessInterrupted(const RetryPolicy& policy, double seconds);

bool IsTransient(const absl::Status& status);

// Calls `f` (returning absl::Status or absl::StatusOr) until it succeeds, fails for good, or the
// policy's time is up.
template <typename F>
auto Retry(const RetryPolicy& policy, F&& f) -> decltype(f()) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto elapsed = [&start] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  std::mt19937_64 rng(std::random_device{}());
  double backoff = policy.first_backoff_s;
  double said_at = 0;
  while (true) {
    auto r = f();
    const absl::Status s = [&] {
      if constexpr (std::is_same_v<decltype(r), absl::Status>) {
        return r;
      } else {
        return r.status();
      }
    }();
    if (s.ok() || !IsTransient(s) || elapsed() > policy.timeout_s) return r;
    const double wait = std::min(
        backoff * (1.0 + policy.jitter * std::uniform_real_distribution<double>()(rng)),
        std::max(0.0, policy.timeout_s - elapsed()) + 0.01);  // the last try at the limit
    if (policy.say && elapsed() - said_at >= policy.say_every_s) {
      said_at = elapsed();
      policy.say(s, said_at, wait);
    }
    if (absl::Status stop = SleepUnlessInterrupted(policy, wait); !stop.ok()) return stop;
    backoff = std::min(backoff * 2, policy.max_backoff_s);
  }
}

struct SessionOptions {
  std::string run_id;
  std::string name;
  uint64_t config_hash = 0;  // of the island's [model]
  // The island's parameters (names and sizes, in order), sent with its joins so that a refusal
  // for a different model names the first parameter that differs; empty: not sent.
  std::vector<std::pair<std::string, uint64_t>> parameters;
  uint32_t data_parallel = 1;  // the island's data-parallel ranks (its weight per step)
  double heartbeat_s = 1;
  RetryPolicy retry;
  // Where the session credential is kept while the island is a member (mode 0600). An island that
  // restarts after a crash uses it to end its old membership first, instead of waiting for the
  // service to declare it dead. Empty: not kept.
  std::string credential_file;
  // Where the island's words go while it joins (e.g. "waiting for the coordinator ..."); empty:
  // nowhere.
  std::function<void(const std::string&)> say;
};

// The session's options from the island's [outer] section.
SessionOptions SessionOptionsOf(const OuterConfig& outer, std::string name, uint64_t config_hash,
                                std::string credential_file);

// The ranks of an island as its outer loop sees them. Decisions that change which collectives run
// next (rejoin, stop, the step to continue at) are taken once and shared, never taken on each rank
// independently; rank 0 speaks for the island to the service.
class IslandRanks {
 public:
  virtual ~IslandRanks() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether `flag` holds on any rank, on every rank.
  virtual absl::StatusOr<bool> Any(bool flag) = 0;
  // The bytes of the lowest rank where `eligible` holds (rank 0's where it holds nowhere), on
  // every rank: a fragment's news come from the first rank that carries it.
  virtual absl::StatusOr<std::string> FromFirstWhere(bool eligible, const std::string& bytes) = 0;
  // Rank 0's bytes, on every rank.
  virtual absl::StatusOr<std::string> FromFirst(const std::string& bytes) = 0;
};

// An island of one rank.
std::unique_ptr<IslandRanks> SingleRank();

class IslandSession {
 public:
  // Joins the run (retrying as the policy says). The session leaves the run when destroyed.
  static absl::StatusOr<std::unique_ptr<IslandSession>> Join(Transport& transport,
                                                             SessionOptions options);
  // The session of ranks other than 0: rank 0 joined (`joined` is its answer) and speaks for the
  // island (heartbeats, rejoins, leave); this one only carries the credential in its calls.
  static std::unique_ptr<IslandSession> Follow(Transport& transport, SessionOptions options,
                                               pb::JoinResponse joined);
  // Joins as rank 0 (with retries) and shares the answer with the island's other ranks, which
  // follow it.
  static absl::StatusOr<std::unique_ptr<IslandSession>> JoinAsIsland(Transport& transport,
                                                                     SessionOptions options,
                                                                     IslandRanks& ranks);
  ~IslandSession();
  bool leads() const { return !follower_; }

  const pb::JoinResponse& joined() const { return joined_; }
  const std::string& run_id() const { return options_.run_id; }
  const std::string& island_id() const { return identity_->island_id(); }
  uint32_t data_stream() const { return data_stream_; }
  std::shared_ptr<const IslandIdentity> identity() const { return identity_; }

  // Async islands start together (as sync ones do in their first round): waits until the run's
  // islands have all joined, the run has started, or the retry time is up.
  absl::Status WaitForPeers();
  void StartHeartbeats();
  void set_step(int64_t step) { step_ = step; }
  // What the next heartbeats report of the island's training (rank 0; any thread).
  void set_telemetry(const pb::IslandTelemetry& telemetry);
  // The first refusal the heartbeat thread received since the last call (the service dropped the
  // island, or restarted without it): the island should rejoin.
  std::optional<absl::Status> TakeRefusal();
  // One heartbeat now; `finished`: the island has pushed its last contribution (async).
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(bool finished);
  // Joins again under the same name, asking for the same data stream, with a new session
  // credential. An island the service still counts as a member keeps its session. Every rank
  // calls it; rank 0 joins and the others take its answer.
  absl::Status Rejoin(IslandRanks& ranks);
  // Stops the heartbeats and says goodbye (best effort: the service also drops silent islands).
  void Leave();
  // Tells the island's console (SessionOptions::say; nothing on other ranks).
  void Say(const std::string& line) const {
    if (options_.say) options_.say(line);
  }

 private:
  IslandSession(Transport& transport, SessionOptions options, pb::JoinResponse joined);
  void HeartbeatLoop();
  pb::HeartbeatRequest Beat(bool finished) const;
  void KeepCredential() const;
  void StopHeartbeats();

  Transport& transport_;
  const SessionOptions options_;
  bool follower_ = false;
  pb::JoinResponse joined_;
  uint32_t data_stream_;
  std::shared_ptr<IslandIdentity> identity_;
  std::atomic<int64_t> step_{0};
  mutable std::mutex telemetry_mu_;
  pb::IslandTelemetry telemetry_;
  bool left_ = false;
  // The heartbeat thread.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<absl::Status> refusal_;
  std::thread heartbeats_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_ISLAND_SESSION_H_
