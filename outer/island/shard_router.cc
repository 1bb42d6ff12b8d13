#include "outer/island/shard_router.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"

namespace atl::outer {

void ShardRouter::Route(const pb::JoinResponse& joined) {
  std::lock_guard<std::mutex> lock(mu_);
  shards_.assign(joined.shards().begin(), joined.shards().end());
}

absl::StatusOr<Transport*> ShardRouter::For(uint32_t fragment) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shards_.empty()) return coordinator_.get();
  const std::string& address = shards_[fragment % shards_.size()];
  auto it = connected_.find(address);
  if (it != connected_.end()) return it->second.get();
  if (connected_.size() >= kMaxShardAddresses) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator named more than ", kMaxShardAddresses, " distinct shard addresses"));
  }
  auto opened = connect_(address);
  if (!opened.ok()) {
    return absl::UnavailableError(absl::StrCat("shard ", fragment % shards_.size(), " at ",
                                               address, ": ", opened.status().message()));
  }
  if (cancelled_) (*opened)->Cancel();
  return connected_.emplace(address, *std::move(opened)).first->second.get();
}

void ShardRouter::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  coordinator_->Cancel();
  for (auto& [address, shard] : connected_) shard->Cancel();
}

absl::StatusOr<pb::PushResponse> ShardRouter::Push(const PushSource& source, int lane) {
  // The first message names the fragment; it is handed on as the first of the routed push.
  std::optional<pb::PushRequest> first(std::in_place);
  ATL_ASSIGN_OR_RETURN(auto more, source(&*first));
  if (!more) first.reset();
  ATL_ASSIGN_OR_RETURN(auto to, For(first ? first->chunk().header().fragment() : 0));
  return to->Push(
      [&](pb::PushRequest* next) -> absl::StatusOr<bool> {
        if (!first) return source(next);
        *next = *std::move(first);
        first.reset();
        return true;
      },
      lane);
}

absl::Status ShardRouter::AwaitUpdate(const pb::UpdateRequest& r,
                                      const ChunkSink<pb::UpdateChunk>& sink, int lane) {
  ATL_ASSIGN_OR_RETURN(auto to, For(r.fragment()));
  return to->AwaitUpdate(r, sink, lane);
}

absl::Status ShardRouter::FetchState(const pb::FetchStateRequest& r,
                                     const ChunkSink<pb::StateChunk>& sink, int lane) {
  ATL_ASSIGN_OR_RETURN(auto to, For(r.fragment()));
  return to->FetchState(r, sink, lane);
}

}  // namespace atl::outer
