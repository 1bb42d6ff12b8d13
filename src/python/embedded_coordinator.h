// A run's coordinator inside the calling process (atoll.Coordinator from Python: notebooks and
// tests): `atoll coordinator` itself (src/service/coordinator.h) on its own thread, serving gRPC
// over TCP, until the run ends or Stop. It serves a module's parameters (ModuleParams): the
// Python package links no libtorch, so atoll's own model of config.model, which only libtorch
// builds, is served by `atoll coordinator`.
#ifndef ATOLL_SRC_PYTHON_EMBEDDED_COORDINATOR_H_
#define ATOLL_SRC_PYTHON_EMBEDDED_COORDINATOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "src/service/coordinator.h"

namespace atl::python {

struct EmbeddedCoordinatorOptions {
  Config config;
  std::string listen = "127.0.0.1:0";  // port 0: a free port
  std::string token;                   // the run token ("" without)
  std::string run_dir;                 // durable state and rounds.jsonl; "" without
  bool resume = false;
  std::string http_listen;             // the status page and /metrics ("" off)
  std::optional<ModuleParams> module;  // the run's parameters (required)
  FILE* out = stderr;                  // the coordinator's lines (nullptr: quiet)
};

class EmbeddedCoordinator {
 public:
  // Returns once it serves (or with the reason it could not start).
  static absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> Start(EmbeddedCoordinatorOptions options);
  // Stops serving (if it still does) and waits for the thread.
  ~EmbeddedCoordinator();

  const std::string& address() const { return address_; }
  // Waits up to `timeout_s` for the run to end (its last round committed and every island gone);
  // true when it has ended. The run's error, if it failed.
  absl::StatusOr<bool> Wait(double timeout_s);
  // Stops serving now; the run's status.
  absl::Status Stop();

  // Each committed round's record, as rounds.jsonl has it (JSON), in commit order, and their
  // count: the rounds committed while this object served.
  std::vector<std::string> rounds() const;
  uint64_t committed_rounds() const;
  std::vector<uint64_t> params_hashes() const;  // each fragment's global parameters, now
  std::vector<std::vector<float>> params() const;  // each fragment's, flat (a copy)
  std::vector<std::vector<std::string>> fragment_parameters() const;

 private:
  EmbeddedCoordinator() = default;
  void Run();

  EmbeddedCoordinatorOptions options_;
  FILE* null_out_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false, ended_ = false;
  absl::Status status_;
  std::string address_;
  const outer::SyncServer* sync_ = nullptr;  // while serving (read under mu_)
  // The service's last state, once it stopped serving.
  std::vector<uint64_t> final_hashes_;
  std::vector<std::vector<float>> final_params_;
  std::vector<std::vector<std::string>> fragment_parameters_;
  // A commit reports its round while it holds the service's locks, which the getters above take
  // under mu_: its records have a lock of their own.
  mutable std::mutex rounds_mu_;
  std::vector<std::string> rounds_;
  std::once_flag stopped_;
};

}  // namespace atl::python

#endif  // ATOLL_SRC_PYTHON_EMBEDDED_COORDINATOR_H_
