// The device mesh of an island in torchtitan's vocabulary: pp x dp_replicate x dp_shard x tp,
// pp outermost and tp innermost (rank = ((pp * R + dp_replicate) * S + dp_shard) * T + tp), with
// a process group for each dimension (the ranks that differ only in it) and one for data
// parallelism as a whole (dp_replicate x dp_shard).
#ifndef ATOLL_INNER_PARALLEL_MESH_H_
#define ATOLL_INNER_PARALLEL_MESH_H_

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "inner/parallel/communicator.h"
#include "inner/parallel/parallelism_config.h"

namespace atl::inner::parallel {

enum class MeshDim { kPp = 0, kDpReplicate = 1, kDpShard = 2, kTp = 3 };
const char* MeshDimName(MeshDim dim);

struct MeshShape {
  int pp = 1, dp_replicate = 1, dp_shard = 1, tp = 1;
  int size() const { return pp * dp_replicate * dp_shard * tp; }
  int degree(MeshDim d) const;
  int dp() const { return dp_replicate * dp_shard; }
};

// The degrees for `world_size` ranks: at most one -1, and the product must be the world size.
absl::StatusOr<MeshShape> ResolveMesh(const ParallelismConfig& config, int world_size);

class DeviceMesh {
 public:
  // Creates every group this rank belongs to (collectively: every rank must call it). Collectives
  // fail after `timeout`; the control group (world-sized, for decisions rank 0 takes while it
  // waits on the outer-sync service) after `control_timeout`.
  static absl::StatusOr<std::unique_ptr<DeviceMesh>> Create(
      const MeshShape& shape, const RankInfo& info, bool cuda, std::chrono::milliseconds timeout,
      std::chrono::milliseconds control_timeout = std::chrono::milliseconds(0));
  // One rank, no communication.
  static std::unique_ptr<DeviceMesh> Single();

  const MeshShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  int coordinate(MeshDim d) const { return coords_[int(d)]; }
  // This rank's place among the data-parallel ranks (replicate-major).
  int dp_rank() const {
    return coordinate(MeshDim::kDpReplicate) * shape_.dp_shard + coordinate(MeshDim::kDpShard);
  }
  Communicator& group(MeshDim d) { return *groups_[int(d)]; }
  Communicator& dp() { return *dp_; }
  Communicator& world() { return *world_; }
  // Every rank, with the control timeout (CPU: the decisions are a few bytes).
  Communicator& control() { return *control_; }

 private:
  DeviceMesh() = default;
  MeshShape shape_;
  int rank_ = 0;
  int coords_[4] = {0, 0, 0, 0};
  std::shared_ptr<Store> store_;
  std::unique_ptr<Communicator> groups_[4];
  std::unique_ptr<Communicator> dp_, world_, control_;
};

}  // namespace atl::inner::parallel

#endif  // ATOLL_INNER_PARALLEL_MESH_H_
