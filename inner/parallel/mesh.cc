#include "inner/parallel/mesh.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"

namespace atl::inner::parallel {

const char* MeshDimName(MeshDim d) {
  switch (d) {
    case MeshDim::kPp: return "pp";
    case MeshDim::kDpReplicate: return "dp_replicate";
    case MeshDim::kDpShard: return "dp_shard";
    case MeshDim::kTp: return "tp";
  }
  return "?";
}

int MeshShape::degree(MeshDim d) const {
  switch (d) {
    case MeshDim::kPp: return pp;
    case MeshDim::kDpReplicate: return dp_replicate;
    case MeshDim::kDpShard: return dp_shard;
    case MeshDim::kTp: return tp;
  }
  return 1;
}

absl::StatusOr<MeshShape> ResolveMesh(const ParallelismConfig& c, int world_size) {
  ATL_RETURN_IF_ERROR(Validate(c));
  int known = 1;
  for (int v : {c.data_parallel_replicate_degree, c.data_parallel_shard_degree,
                c.tensor_parallel_degree, c.pipeline_parallel_degree}) {
    if (v > 0) known *= v;
  }
  const auto rest = [&](int v) { return v == -1 ? world_size / known : v; };
  MeshShape m;
  m.dp_replicate = rest(c.data_parallel_replicate_degree);
  m.dp_shard = rest(c.data_parallel_shard_degree);
  m.tp = rest(c.tensor_parallel_degree);
  m.pp = rest(c.pipeline_parallel_degree);
  if (m.dp_replicate < 1 || m.dp_shard < 1 || m.tp < 1 || m.pp < 1 || m.size() != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the parallelism degrees (dp_replicate ", c.data_parallel_replicate_degree, ", dp_shard ",
        c.data_parallel_shard_degree, ", tp ", c.tensor_parallel_degree, ", pp ",
        c.pipeline_parallel_degree, ") do not multiply to the island's ", world_size, " ranks"));
  }
  return m;
}

std::unique_ptr<DeviceMesh> DeviceMesh::Single() {
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh());
  for (int d = 0; d < 4; ++d) {
    mesh->groups_[d] = *Communicator::Create(nullptr, "", 0, 1, false, std::chrono::seconds(1));
  }
  mesh->dp_ = *Communicator::Create(nullptr, "", 0, 1, false, std::chrono::seconds(1));
  mesh->world_ = *Communicator::Create(nullptr, "", 0, 1, false, std::chrono::seconds(1));
  mesh->control_ = *Communicator::Create(nullptr, "", 0, 1, false, std::chrono::seconds(1));
  return mesh;
}

absl::StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(
    const MeshShape& shape, const RankInfo& info, bool cuda, std::chrono::milliseconds timeout,
    std::chrono::milliseconds control_timeout) {
  if (shape.size() != info.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("a mesh of ", shape.size(), " ranks for ",
                                                   info.world_size, " processes"));
  }
  if (info.world_size == 1) return Single();
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh());
  mesh->shape_ = shape;
  mesh->rank_ = info.rank;
  const int deg[4] = {shape.pp, shape.dp_replicate, shape.dp_shard, shape.tp};
  int stride[4];
  stride[3] = 1;
  for (int d = 2; d >= 0; --d) stride[d] = stride[d + 1] * deg[d + 1];
  for (int d = 0; d < 4; ++d) mesh->coords_[d] = (info.rank / stride[d]) % deg[d];
  ATL_ASSIGN_OR_RETURN(auto store, Rendezvous(info, timeout));
  mesh->store_ = store;
  // A group's name lists the coordinates its members share.
  auto key = [&](const std::vector<int>& free_dims) {
    std::string k;
    for (int d = 0; d < 4; ++d) {
      const bool free = std::find(free_dims.begin(), free_dims.end(), d) != free_dims.end();
      k += free ? "*" : std::to_string(mesh->coords_[d]);
      k += d < 3 ? "." : "";
    }
    return k;
  };
  for (int d = 0; d < 4; ++d) {
    ATL_ASSIGN_OR_RETURN(
        auto g,
        Communicator::Create(mesh->store_, absl::StrCat(MeshDimName(MeshDim(d)), "/", key({d})),
                             mesh->coords_[d], deg[d], cuda, timeout));
    mesh->groups_[d] = std::move(g);
  }
  ATL_ASSIGN_OR_RETURN(auto dp, Communicator::Create(mesh->store_, absl::StrCat("dp/", key({1, 2})),
                                                     mesh->dp_rank(), shape.dp(), cuda, timeout));
  mesh->dp_ = std::move(dp);
  ATL_ASSIGN_OR_RETURN(auto world, Communicator::Create(mesh->store_, "world", info.rank,
                                                        info.world_size, cuda, timeout));
  mesh->world_ = std::move(world);
  ATL_ASSIGN_OR_RETURN(auto control,
                       Communicator::Create(mesh->store_, "control", info.rank, info.world_size,
                                            /*cuda=*/false, std::max(timeout, control_timeout)));
  mesh->control_ = std::move(control);
  return mesh;
}

}  // namespace atl::inner::parallel
