// The service's state: the whole of a fragment's global parameters streamed to an island (a join,
// a resync), and its durable state, tensor by tensor, so that no whole copy of a fragment is ever
// made. A part of the sync server (outer/service/sync_server.h).
//
// Snapshot() hands `write` each fragment's tensors in order (parameters, then the optimizer's
// named state) while that fragment's data is locked (its commits wait; membership and pushes do
// not), and returns the state's description: rounds, membership epoch, each tensor's size and
// XXH64, no tensor bytes. Restore() checks a description against this service, reads every tensor
// through `read` into new memory and checks its hash, then replaces the state: all or nothing,
// before any island joins. With the durability gate on, a committed round is handed to islands only
// once MarkDurable() has been called with a description that contains it, so no island ever
// applies a round that a crash of the service could lose.
#ifndef ATOLL_OUTER_SERVICE_STATE_STORE_H_
#define ATOLL_OUTER_SERVICE_STATE_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "atoll/v1/service_state.pb.h"
#include "outer/service/service_core.h"

namespace atl::outer {

class StateStore {
 public:
  explicit StateStore(ServiceCore& core) : core_(core) {}

  // The tensors of a fragment's state are named: kParamsTensor, then its outer optimizer's
  // (OuterOptimizer::StateTensors: "momentum", "buffer", ...).
  static constexpr const char* kParamsTensor = "params";
  using StateWrite = std::function<absl::Status(uint32_t fragment, const std::string& tensor,
                                                const float* data, size_t n)>;
  // `index`: the fragment's place in the description (a shard's state holds its fragments only).
  using StateRead = std::function<absl::Status(uint32_t index, const std::string& tensor,
                                               float* out, size_t n)>;
  absl::StatusOr<pb::ServiceState> Snapshot(const StateWrite& write) const;
  absl::Status Restore(const pb::ServiceState& description, const StateRead& read);
  void SetDurabilityGate(bool on);
  void MarkDurable(const pb::ServiceState& written);

  // See SyncServer::FetchState.
  absl::Status FetchState(const pb::FetchStateRequest& request,
                          const std::function<bool(pb::StateChunk&&)>& write);

 private:
  // Fragment i's parameters and outer optimizer from its state (the `index`-th of the
  // description), every size checked against this service's and every tensor against its hash.
  absl::StatusOr<std::pair<std::vector<float>, std::unique_ptr<OuterOptimizer>>> ReadFragmentState(
      const pb::FragmentState& state, uint32_t fragment, uint32_t index,
      const StateRead& read) const;
  // That a description fits this service (run, model, the fragments it holds).
  absl::Status CheckDescription(const pb::ServiceState& state,
                                const std::vector<uint32_t>& owned) const;

  ServiceCore& core_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_STATE_STORE_H_
