// The trainer as the outer step sees it: of each fragment, the parts of its parameters this rank
// owns (all of them with one rank), in the service's order. With tensor parallelism the
// parameters that every TP rank holds whole are owned by TP rank 0, which alone pushes and
// receives them; SyncReplicas hands what it merged to the other TP ranks (the ranks of an island
// do not always merge the same fragments at the same step: a rank whose push failed rejoins).
#ifndef ATOLL_SRC_SHARD_MODEL_H_
#define ATOLL_SRC_SHARD_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inner/trainer.h"
#include "outer/outer_step.h"
#include "outer/transport.h"

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
  // 0), at the same places on every TP rank.
  ShardModel(inner::Trainer& trainer, std::vector<std::vector<Piece>> pieces,
             std::vector<std::vector<size_t>> whole, std::vector<uint64_t> elements);

  int64_t step() const override { return trainer_.step(); }
  std::vector<float> Snapshot(uint32_t f) override;
  void Merge(uint32_t f, const std::vector<float>& global, double alpha) override;
  // Every TP rank calls it after each call of the outer step that can merge: TP rank 0 says which
  // fragments it merged since the last call and sends their whole parameters to the other ranks.
  absl::Status SyncReplicas();
  void JumpToStep(int64_t step) override { trainer_.SetStep(step); }
  void FollowRunProgress(int64_t position) override { trainer_.SetSchedulePosition(position); }

  // What this rank carries of each fragment.
  std::vector<outer::FragmentShare> Shares() const;

 private:
  at::Tensor Part(const Piece& p);

  inner::Trainer& trainer_;
  const std::vector<std::vector<Piece>> pieces_;
  const std::vector<std::vector<size_t>> whole_;
  const std::vector<uint64_t> elements_;
  std::vector<bool> merged_;  // since the last SyncReplicas
};

// The service's fragments mapped onto this rank's parameter shards: which part of which fragment
// each shard is.
absl::StatusOr<ShardModel> MapFragments(const ::atollpb::v1::JoinResponse& joined,
                                        inner::Trainer& trainer);

}  // namespace atl

#endif  // ATOLL_SRC_SHARD_MODEL_H_
