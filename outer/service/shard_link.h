// A sharded service (outer.shards > 1): fragment f lives on shard f % num_shards. The coordinator
// (the control plane) keeps membership and the schedule and holds no fragment's data; each shard
// server holds its fragments, reports to the coordinator (its address, its rounds, the islands it
// heard from) and mirrors the coordinator's membership. A part of the sync server
// (outer/service/sync_server.h).
#ifndef ATOLL_OUTER_SERVICE_SHARD_LINK_H_
#define ATOLL_OUTER_SERVICE_SHARD_LINK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "outer/service/rounds.h"
#include "outer/service/service_core.h"

namespace atl::outer {

class ShardLink {
 public:
  ShardLink(ServiceCore& core, Rounds& rounds) : core_(core), rounds_(rounds) {}

  // See SyncServer::ShardSync / ShardReport / MirrorMembership.
  absl::StatusOr<pb::ShardSyncResponse> ShardSync(const pb::ShardSyncRequest& request,
                                                  absl::Time deadline);
  pb::ShardSyncRequest ShardReport(const std::string& address);
  void MirrorMembership(const pb::ShardSyncResponse& view);

 private:
  // Refuses a shard's call that does not fit this run (the checks that need no lock).
  absl::Status CheckShardCall(const pb::ShardSyncRequest& request) const;

  ServiceCore& core_;
  Rounds& rounds_;
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_SERVICE_SHARD_LINK_H_
