// `atoll coordinator`: hosts the Coordinator and OuterSync services of one run.
#ifndef ATOLL_SRC_SERVICE_COORDINATOR_H_
#define ATOLL_SRC_SERVICE_COORDINATOR_H_

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/service/sync_server.h"
#include "src/config/config.h"
#include "src/net/grpc_server.h"
#include "src/service/sync_setup.h"
#include "src/store/service_state_file.h"

namespace atl {

namespace pb = ::atollpb::v1;

struct CoordinatorOptions {
  GrpcServerOptions server;
  // rounds.jsonl and the durable service state (service-state.pb, rewritten every
  // outer.durable_every rounds and at shutdown); optional. Without it nothing is durable.
  std::string run_dir;
  bool resume = false;                       // continue from run_dir's service state
  // Off when empty; "HOST:PORT" (port 0: any free port) serves GET /metrics (Prometheus text
  // format), and for http_listen also the status page (/), its data (/api/status) and probes
  // (/healthz, /readyz).
  std::string metrics_listen;
  std::string http_listen;
  // Non-empty: every path of those servers but the probes requires it (HttpAccess).
  std::string http_token;
  // `atoll sync-server --shard K/N`: shard server K of a sharded service (outer.shards = N). It
  // serves the fragments f with f mod N == K, keeps their durable state in run_dir, and mirrors
  // the membership of the coordinator at `coordinator` (HOST:PORT), telling it `advertise` as the
  // address islands reach it at (empty: the address it listens on). -1: the run's coordinator.
  int shard = -1;
  std::string coordinator;
  std::string shard_token;                   // what the shard presents to the coordinator
  std::string advertise;
  double rpc_timeout_s = 60;                 // of the calls to the coordinator
  FILE* out = stdout;                        // "listening on HOST:PORT", then one line per round
  const std::atomic<bool>* stop = nullptr;   // SIGINT / SIGTERM
  // The run's SyncServer, for the coordinator (outer::SyncServerOptions::kControlPlane) or a
  // shard: the binary's is MakeSyncServer (src/service/initial_state.h: atoll's model of
  // config.model, or `module`). Null: only a module's run is served (`module` is required).
  std::function<absl::StatusOr<std::unique_ptr<outer::SyncServer>>(const Config&, int shard)>
      make_sync;
  // Embedding (the Python module): the run's model when atoll does not build it; told the
  // address and the service once it serves; told each committed round's record (a rounds.jsonl
  // line), on the committing thread; told once serving has stopped, before the service is
  // destroyed.
  const ModuleParams* module = nullptr;
  std::function<void(const std::string& address, const outer::SyncServer& sync)> on_serving;
  std::function<void(const std::string& record)> on_round;
  std::function<void(const outer::SyncServer& sync)> on_stopped;
};

// Serves until `stop` is set, or until the run's last round has committed and every island has
// left (a shard server: its fragments' last rounds, and the coordinator says no island is left or
// has gone).
absl::Status RunCoordinator(const Config& config, const CoordinatorOptions& options);


}  // namespace atl

#endif  // ATOLL_SRC_SERVICE_COORDINATOR_H_
