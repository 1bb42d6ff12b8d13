#include "outer/service/sync_server.h"

#include <utility>

#include "compression/status_macros.h"

namespace atl::outer {

SyncServer::SyncServer(SyncServerOptions options, FragmentLayout layout, std::vector<float> initial)
    : SyncServer(std::move(options), std::vector<FragmentLayout>{std::move(layout)},
                 std::vector<std::vector<float>>{std::move(initial)}) {}

SyncServer::SyncServer(SyncServerOptions options, std::vector<FragmentLayout> layouts,
                       std::vector<std::vector<float>> initial)
    : core_(std::move(options), std::move(layouts), std::move(initial)),
      rounds_(core_),
      desk_(core_, rounds_),
      state_(core_),
      shards_(core_, rounds_),
      moments_(core_) {}

absl::StatusOr<pb::PushResponse> SyncServer::Push(const std::vector<pb::PushRequest>& requests) {
  if (requests.empty()) return absl::InvalidArgumentError("empty push: no chunks");
  ATL_ASSIGN_OR_RETURN(auto stream, OpenPush(requests.front()));
  for (const auto& r : requests) {
    ATL_RETURN_IF_ERROR(stream->Add(pb::PushRequest(r)));
  }
  return FinishPush(std::move(stream));
}

void SyncServer::SetCommitListener(std::function<void(const CommittedRound&)> listener) {
  std::lock_guard<std::mutex> lock(core_.mu);
  core_.on_commit = std::move(listener);
}

void SyncServer::SetEventListener(std::function<void(const std::string&)> listener) {
  std::lock_guard<std::mutex> lock(core_.mu);
  core_.on_event = std::move(listener);
}

uint64_t SyncServer::round(uint32_t fragment) const {
  std::lock_guard<std::mutex> lock(core_.mu);
  return core_.fragments.at(fragment).round;
}

uint64_t SyncServer::params_hash(uint32_t fragment) const {
  std::lock_guard<std::mutex> lock(core_.mu);
  return core_.fragments.at(fragment).params_hash;
}

std::vector<float> SyncServer::params(uint32_t fragment) const {
  const ServiceFragment& f = core_.fragments.at(fragment);
  std::lock_guard<std::mutex> lock(*f.data_mu);
  return f.data.params();
}

std::vector<std::vector<float>> SyncServer::optimizer_state(uint32_t fragment) const {
  const ServiceFragment& f = core_.fragments.at(fragment);
  std::lock_guard<std::mutex> lock(*f.data_mu);
  std::vector<std::vector<float>> out;
  for (const auto& t : f.data.optimizer().StateTensors()) out.push_back(*t.values);
  return out;
}

bool SyncServer::budget_reached() const {
  std::lock_guard<std::mutex> lock(core_.mu);
  return core_.options.token_budget > 0 && core_.tokens_committed >= core_.options.token_budget;
}

uint64_t SyncServer::committed_rounds() const {
  std::lock_guard<std::mutex> lock(core_.mu);
  uint64_t n = 0;
  for (const auto& f : core_.fragments) n += f.round;
  return n;
}

}  // namespace atl::outer
