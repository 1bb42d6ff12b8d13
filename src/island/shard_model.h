// The trainer as the outer step sees it: of each fragment, the parts of its parameters this rank
// owns (all of them with one rank), in the service's order. Replicated copies push once: with
// tensor parallelism the parameters that every TP rank holds whole are owned by TP rank 0, which
// alone pushes and receives them; with replicated shards (HSDP, dp_replicate > 1) replica 0 owns
// them all and the other replicas carry nothing of any fragment. SyncReplicas hands what the
// owners merged to their copies (the ranks of an island do not always merge the same fragments at
// the same step: a rank whose push failed rejoins).
#ifndef ATOLL_SRC_ISLAND_SHARD_MODEL_H_
#define ATOLL_SRC_ISLAND_SHARD_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/parallel/mesh.h"
#include "inner/trainer.h"
#include "outer/island/outer_step.h"
#include "outer/base/transport.h"
#include "src/island/tensor_device_copy.h"

namespace atl {

class ShardModel : public outer::IslandModel {
 public:
  struct Piece {
    size_t shard;    // index into the trainer's parameter shards
    uint64_t at;     // first element within the shard
    uint64_t begin;  // within the fragment
    uint64_t count;
  };

  // `whole`: per fragment, the shards of the parameters whole on every TP rank (owned by TP rank
  // 0), at the same places on every TP rank; `all`: per fragment, every shard of its parameters
  // (at the same places on every replica).
  ShardModel(inner::Trainer& trainer, std::vector<std::vector<Piece>> pieces,
             std::vector<std::vector<size_t>> whole, std::vector<std::vector<size_t>> all,
             std::vector<uint64_t> elements);

  int64_t step() const override { return trainer_.step(); }
  std::vector<float> Snapshot(uint32_t f) override;
  void Merge(uint32_t f, const std::vector<float>& global, double alpha) override;
  outer::DeviceCopy* device_copy(uint32_t f) override {
    return f < device_.size() ? device_[f].get() : nullptr;
  }
  // outer.global_copy: "device" keeps a copy of each carried fragment's global parameters on the
  // parameters' device, where pseudo-gradients are then made and encoded; "auto" does so when that
  // device is a GPU; "host" keeps none. Before the outer step is made.
  absl::Status PlaceGlobalCopy(outer::GlobalCopy where, const compression::CodecSpec& codec);
  // Every rank calls it after each call of the outer step that can merge: TP rank 0 says which
  // fragments it merged since the last call and sends their whole parameters to the other TP
  // ranks; then replica 0 sends the shards of the fragments it merged to the other replicas.
  absl::Status SyncReplicas();
  void JumpToStep(int64_t step) override { trainer_.SetStep(step); }
  // Moments: the optimizer's exp_avg (Muon's momentum) and exp_avg_sq of the owned pieces. Not
  // with tensor parallelism or replicated shards (their copies of the moments would part).
  std::string moment_optimizer() const override;
  std::vector<float> MomentSnapshot(uint32_t f) override;
  void LoadMoments(uint32_t f, const std::vector<float>& moments) override;
  bool MomentsFresh() const override { return trainer_.optimizer().step() == 0; }
  void FollowRunProgress(int64_t position) override { trainer_.SetSchedulePosition(position); }

  // What this rank carries of each fragment.
  std::vector<outer::FragmentShare> Shares() const;

 private:
  at::Tensor Part(const Piece& p);
  // Root 0 of the mesh group `dim` says which fragments it merged (`merged`) and sends the given
  // shards of each (`shards`) to the group's other ranks.
  absl::Status SyncFrom(inner::parallel::MeshDim dim, const std::vector<bool>& merged,
                        const std::vector<std::vector<size_t>>& shards);

  inner::Trainer& trainer_;
  const std::vector<std::vector<Piece>> pieces_;
  const std::vector<std::vector<size_t>> whole_;
  const std::vector<std::vector<size_t>> all_;
  const std::vector<uint64_t> elements_;
  std::vector<bool> merged_;  // since the last SyncReplicas
  std::vector<std::unique_ptr<TensorDeviceCopy>> device_;  // per fragment; null: none
};

// The service's fragments mapped onto this rank's parameter shards: which part of which fragment
// each shard is.
absl::StatusOr<ShardModel> MapFragments(const ::atollpb::v1::JoinResponse& joined,
                                        inner::Trainer& trainer);

}  // namespace atl

#endif  // ATOLL_SRC_ISLAND_SHARD_MODEL_H_
