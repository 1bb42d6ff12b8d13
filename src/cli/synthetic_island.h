// The load test's synthetic islands (`atoll loadtest`): threads of this process, each with its
// own gRPC connection, that join, heartbeat, push random pseudo-gradients of the model's size
// chunk by chunk and receive every round's update, as islands do, without training. Each runs the
// one training loop (inner/loop.h) over a step counter: its outer step pushes and receives every
// H steps, in step with the others (a round starts once every island has finished the one before,
// so that its phases can be timed from a common start).
#ifndef ATOLL_SRC_CLI_SYNTHETIC_ISLAND_H_
#define ATOLL_SRC_CLI_SYNTHETIC_ISLAND_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/config/config.h"

namespace atl {

using LoadClock = std::chrono::steady_clock;

// One heartbeat: when it was sent and how long its answer took.
struct Beat {
  LoadClock::time_point sent;
  double latency_s = 0;
};

// What the islands saw of one round (of every fragment), all together.
struct RoundTimes {
  LoadClock::time_point start;         // when every island began it
  LoadClock::time_point sent;          // the last chunk written (of all islands and fragments)
  LoadClock::time_point first_update;  // the first chunk of an update received
  LoadClock::time_point done;          // every update received by every island
  // Per fragment: its last chunk written (of all islands) and the first chunk of its update
  // received (by any island). CommitSeconds() is the longest gap between the two.
  struct Fragment {
    LoadClock::time_point sent = LoadClock::time_point::min();
    LoadClock::time_point first_update = LoadClock::time_point::max();
  };
  std::vector<Fragment> fragments;
  double CommitSeconds() const;
  uint64_t bytes_pushed = 0, bytes_received = 0;
};

class SyntheticIsland;

// `count` synthetic islands of one run.
class SyntheticIslands {
 public:
  // They join `config`'s run at `address` and heartbeat every `heartbeat_every_s`.
  static absl::StatusOr<std::unique_ptr<SyntheticIslands>> Join(const Config& config, int count,
                                                                const std::string& address,
                                                                const std::string& token,
                                                                double heartbeat_every_s);
  ~SyntheticIslands();

  // Runs `rounds` rounds on every island (each in its loop, in a thread of its own); `on_round`
  // sees each round's times once every island has finished it. A stop ends them after the
  // current round (CANCELLED).
  absl::Status RunRounds(int rounds, const std::atomic<bool>* stop,
                         const std::function<void(int round, const RoundTimes&)>& on_round);
  // Ends the heartbeats, then the memberships (refused if any heartbeat failed).
  absl::Status Leave(const std::string& log_hint);
  std::vector<Beat> Heartbeats() const;
  // The bytes of one island's contribution to one round.
  uint64_t contribution_bytes() const;

 private:
  SyntheticIslands() = default;
  std::vector<std::unique_ptr<SyntheticIsland>> islands_;
};

}  // namespace atl

#endif  // ATOLL_SRC_CLI_SYNTHETIC_ISLAND_H_
