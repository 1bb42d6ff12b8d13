// Live monitoring of a run: Prometheus metrics of the coordinator (ServiceMonitor) and of each
// island process (IslandMonitor), and the data behind the coordinator's status page.
//
// Names follow Prometheus conventions: atoll_ prefix, base units in the name (_seconds, _bytes),
// counters end in _total. Both monitors are thread-safe: training, gRPC and HTTP threads call them.
#ifndef ATOLL_SRC_OBSERVE_MONITORING_H_
#define ATOLL_SRC_OBSERVE_MONITORING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "outer/island/island_sync.h"
#include "outer/service/sync_server.h"

namespace atl {

class TrafficCounters;

// What the page says of the run besides what the service knows.
struct RunFacts {
  std::string run_id;
  bool async = false;
  int islands = 0;          // data streams (M)
  int sync_every = 0;       // H
  int fragments = 1;
  uint64_t total_rounds = 0;   // sync: over all fragments
  int64_t total_steps = 0;
};

class ServiceMonitor {
 public:
  // `traffic` (may be null): bytes the gRPC server moved per island.
  ServiceMonitor(const outer::SyncServer& sync, const TrafficCounters* traffic, RunFacts facts);
  ~ServiceMonitor();

  // From the service's commit listener (under its lock): records and returns at once.
  void OnCommit(const outer::CommittedRound& round);
  // A resumed service: the rounds its rounds.jsonl kept (records, oldest first) start the status
  // page's timeline, and its clock goes on from the last one's wall_s.
  void Resume(const std::vector<std::string>& records);
  // Takes the service's status, the islands' curves and bandwidth; call about once a second.
  void Sample();
  // The Prometheus text exposition (format 0.0.4), current as of this call.
  std::string PrometheusText();
  // The status page's data (GET /api/status), current as of this call.
  std::string StatusJson();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

class IslandMonitor {
 public:
  // Every series carries the labels island="<island>" and rank="<rank>".
  IslandMonitor(const std::string& island, int rank, bool async);
  ~IslandMonitor();

  // After inner steps whose stats came over from the device together: how many, the last one's
  // loss, the island's tokens so far, this process's compute time and wall time since the island
  // started.
  void OnSteps(int64_t steps, double loss, int64_t tokens, double compute_s, double wall_s);
  void OnEval(double val_loss);
  // A merged outer round of `fragment`: bytes, goodput, quantization error, staleness, idle time.
  void OnRound(uint32_t fragment, const outer::RoundOutcome& outcome, double idle_s);
  // A checkpoint: the pause of training to snapshot it; and, later, its write (background thread).
  void OnCheckpointStall(double seconds);
  void OnCheckpointWritten(double seconds);
  double tokens_per_s() const;  // over the last 10 s or so
  std::string PrometheusText();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace atl

#endif  // ATOLL_SRC_OBSERVE_MONITORING_H_
