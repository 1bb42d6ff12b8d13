// The island's transport to a service that may be sharded (outer.shards > 1): membership calls go
// to the coordinator; a data call (push, update, state) of fragment f goes to shard f mod N, at the
// address the coordinator gave at join (JoinResponse.shards). Until a join answer names shards,
// and for an unsharded run, everything goes to the coordinator.
//
// Thread-safe: data calls may run on several threads while a rejoin re-routes; a shard's transport,
// once connected, lives as long as the router (addresses rarely change: a restarted shard listens
// where it did).
#ifndef ATOLL_OUTER_ISLAND_SHARD_ROUTER_H_
#define ATOLL_OUTER_ISLAND_SHARD_ROUTER_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "outer/base/transport.h"

namespace atl::outer {

class ShardRouter : public Transport {
 public:
  // Opens a transport to the shard listening at `address` (host:port).
  using Connect = std::function<absl::StatusOr<std::unique_ptr<Transport>>(const std::string&)>;
  // At most this many distinct shard addresses are connected over the router's life.
  static constexpr size_t kMaxShardAddresses = 256;

  ShardRouter(std::unique_ptr<Transport> coordinator, Connect connect)
      : coordinator_(std::move(coordinator)), connect_(std::move(connect)) {}

  absl::StatusOr<pb::JoinResponse> Join(const pb::JoinRequest& r) override {
    return coordinator_->Join(r);
  }
  absl::Status Leave(const pb::LeaveRequest& r) override { return coordinator_->Leave(r); }
  absl::StatusOr<pb::HeartbeatResponse> Heartbeat(const pb::HeartbeatRequest& r) override {
    return coordinator_->Heartbeat(r);
  }
  void Route(const pb::JoinResponse& joined) override;
  int connections() const override { return coordinator_->connections(); }
  std::string address() const override { return coordinator_->address(); }
  absl::StatusOr<pb::PushResponse> Push(const PushSource& source, int lane) override;
  absl::Status AwaitUpdate(const pb::UpdateRequest& r, const ChunkSink<pb::UpdateChunk>& sink,
                           int lane) override;
  absl::Status FetchState(const pb::FetchStateRequest& r, const ChunkSink<pb::StateChunk>& sink,
                          int lane) override;
  void Cancel() override;  // the coordinator's transport and every shard's, and any connected later

  Transport& coordinator() { return *coordinator_; }

 private:
  // The transport that serves `fragment` (connected on first use).
  absl::StatusOr<Transport*> For(uint32_t fragment);

  std::unique_ptr<Transport> coordinator_;
  Connect connect_;
  std::mutex mu_;
  std::vector<std::string> shards_;  // by shard index; empty: unsharded
  std::map<std::string, std::unique_ptr<Transport>> connected_;  // by address
  bool cancelled_ = false;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_ISLAND_SHARD_ROUTER_H_
