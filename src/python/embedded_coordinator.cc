#include "src/python/embedded_coordinator.h"

#include <algorithm>
#include <chrono>

#include "compression/status_macros.h"

namespace atl::python {

absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> EmbeddedCoordinator::Start(
    EmbeddedCoordinatorOptions options) {
  std::unique_ptr<EmbeddedCoordinator> c(new EmbeddedCoordinator());
  c->options_ = std::move(options);
  if (c->options_.out == nullptr) c->null_out_ = std::fopen("/dev/null", "w");
  c->thread_ = std::thread([raw = c.get()] { raw->Run(); });
  std::unique_lock<std::mutex> lock(c->mu_);
  c->cv_.wait(lock, [&] { return c->serving_ || c->ended_; });
  if (!c->serving_) {
    const absl::Status s = c->status_;
    lock.unlock();
    c->thread_.join();
    return s.ok() ? absl::InternalError("the coordinator ended before it served") : s;
  }
  return c;
}

void EmbeddedCoordinator::Run() {
  CoordinatorOptions o;
  o.server.listen = options_.listen;
  o.server.token = options_.token;
  o.run_dir = options_.run_dir;
  o.resume = options_.resume;
  o.http_listen = options_.http_listen;
  o.out = options_.out != nullptr ? options_.out : null_out_;
  o.stop = &stop_;
  if (options_.module) o.module = &*options_.module;
  o.on_serving = [this](const std::string& address, const outer::SyncServer& sync) {
    std::lock_guard<std::mutex> lock(mu_);
    address_ = address;
    sync_ = &sync;
    for (uint32_t f = 0; f < sync.num_fragments(); ++f) {
      fragment_parameters_.push_back(sync.layout(f).names);
    }
    serving_ = true;
    cv_.notify_all();
  };
  o.on_round = [this](const std::string& record) {
    std::lock_guard<std::mutex> lock(rounds_mu_);
    rounds_.push_back(record);
  };
  o.on_stopped = [this](const outer::SyncServer& sync) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t f = 0; f < sync.num_fragments(); ++f) {
      final_hashes_.push_back(sync.params_hash(f));
      final_params_.push_back(sync.params(f));
    }
    sync_ = nullptr;
  };
  const absl::Status s = RunCoordinator(options_.config, o);
  std::lock_guard<std::mutex> lock(mu_);
  status_ = s;
  sync_ = nullptr;
  ended_ = true;
  cv_.notify_all();
}

EmbeddedCoordinator::~EmbeddedCoordinator() {
  Stop().IgnoreError();
  if (null_out_ != nullptr) std::fclose(null_out_);
}

absl::StatusOr<bool> EmbeddedCoordinator::Wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  // At most a year: longer waits would overflow the clock's count.
  const double bounded = std::clamp(timeout_s, 0.0, 3.2e7);
  const bool ended = cv_.wait_for(lock, std::chrono::duration<double>(bounded),
                                  [&] { return ended_; });
  if (ended && !status_.ok()) return status_;
  return ended;
}

absl::Status EmbeddedCoordinator::Stop() {
  stop_ = true;
  std::call_once(stopped_, [this] {
    if (thread_.joinable()) thread_.join();
  });
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::vector<std::string> EmbeddedCoordinator::rounds() const {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  return rounds_;
}

// The server lives while the thread serves; after it stopped, its last state was kept.
uint64_t EmbeddedCoordinator::committed_rounds() const {
  std::lock_guard<std::mutex> lock(rounds_mu_);
  return uint64_t(rounds_.size());
}

std::vector<uint64_t> EmbeddedCoordinator::params_hashes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> hashes;
  if (sync_ == nullptr) return final_hashes_;
  for (uint32_t f = 0; f < sync_->num_fragments(); ++f) hashes.push_back(sync_->params_hash(f));
  return hashes;
}

std::vector<std::vector<float>> EmbeddedCoordinator::params() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<float>> out;
  if (sync_ == nullptr) return final_params_;
  for (uint32_t f = 0; f < sync_->num_fragments(); ++f) out.push_back(sync_->params(f));
  return out;
}

std::vector<std::vector<std::string>> EmbeddedCoordinator::fragment_parameters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fragment_parameters_;
}

}  // namespace atl::python
