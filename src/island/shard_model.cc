#include "src/island/shard_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/codec_traits.h"
#include "compression/status_macros.h"
#include "inner/parallel/fsdp.h"
#include "inner/parallel/mesh.h"
#include "outer/base/names.h"

namespace atl {

namespace pb = ::atollpb::v1;

namespace {

// The elements of a parameter shard that a piece is.
at::Tensor PartOf(inner::Trainer& trainer, const ShardModel::Piece& p) {
  return trainer.sharded().shards()[p.shard].value.narrow(0, int64_t(p.at), int64_t(p.count));
}

}  // namespace

ShardModel::ShardModel(inner::Trainer& trainer, std::vector<std::vector<Piece>> pieces,
                       std::vector<std::vector<size_t>> whole,
                       std::vector<std::vector<size_t>> all, std::vector<uint64_t> elements)
    : trainer_(trainer),
      pieces_(std::move(pieces)),
      whole_(std::move(whole)),
      all_(std::move(all)),
      elements_(std::move(elements)),
      merged_(pieces_.size(), false) {}

std::vector<float> ShardModel::Snapshot(uint32_t f) {
  std::vector<float> out;
  for (const Piece& p : pieces_[f]) {
    auto v = Part(p).to(torch::kCPU).contiguous();
    out.insert(out.end(), v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
  }
  return out;
}

void ShardModel::Merge(uint32_t f, const std::vector<float>& global, double alpha) {
  if (TensorDeviceCopy* copy = f < device_.size() ? device_[f].get() : nullptr) {
    copy->MergeInto(alpha);
    merged_[f] = true;
    return;
  }
  torch::NoGradGuard no_grad;
  size_t at = 0;
  for (const Piece& p : pieces_[f]) {
    at::Tensor dst = Part(p);
    auto src = torch::from_blob(const_cast<float*>(global.data() + at), {int64_t(p.count)},
                                torch::kFloat);
    if (alpha == 0.0) {
      dst.copy_(src);
    } else {
      dst.mul_(alpha).add_(src.to(dst.device()), 1.0 - alpha);
    }
    at += p.count;
  }
  merged_[f] = true;
}

absl::Status ShardModel::PlaceGlobalCopy(outer::GlobalCopy where,
                                         const compression::CodecSpec& codec) {
  device_.clear();
  device_.resize(pieces_.size());
  const bool on_gpu = !trainer_.sharded().shards().empty() &&
                      trainer_.sharded().shards().front().value.device().is_cuda();
  // A codec without CUDA kernels encodes on the host: "auto" keeps the host path for it. A sparse
  // codec has kernels when its value codec has (codec_traits.h).
  const bool kernels = compression::FindCodec(codec.codec)->cuda;
  if (where == outer::GlobalCopy::kHost ||
      (where == outer::GlobalCopy::kAuto && (!on_gpu || !kernels))) {
    return absl::OkStatus();
  }
  if (on_gpu && !kernels) {
    return absl::FailedPreconditionError(absl::StrCat(
        "outer.global_copy = \"device\" needs a codec with CUDA kernels; ",
        compression::SpecText(codec), " has none (outer.global_copy = \"auto\" or \"host\")"));
  }
  for (size_t f = 0; f < pieces_.size(); ++f) {
    if (pieces_[f].empty()) continue;  // carried by other ranks
    uint64_t n = 0;
    for (const Piece& p : pieces_[f]) n += p.count;
    // The views are taken anew at each use, from the trainer (this object may move).
    auto parts = [&trainer = trainer_, pieces = pieces_[f]] {
      std::vector<at::Tensor> out;
      for (const Piece& p : pieces) out.push_back(PartOf(trainer, p));
      return out;
    };
    const at::Device device = Part(pieces_[f].front()).device();
    ATL_ASSIGN_OR_RETURN(auto copy, TensorDeviceCopy::Create(std::move(parts), n, device));
    device_[f] = std::move(copy);
  }
  return absl::OkStatus();
}

absl::Status ShardModel::SyncReplicas() {
  using inner::parallel::MeshDim;
  const std::vector<bool> merged = merged_;
  std::fill(merged_.begin(), merged_.end(), false);
  // TP first: replica 0's TP ranks then hold what replica 0 merged, which goes to the replicas.
  ATL_RETURN_IF_ERROR(SyncFrom(MeshDim::kTp, merged, whole_));
  return SyncFrom(MeshDim::kDpReplicate, merged, all_);
}

absl::Status ShardModel::SyncFrom(inner::parallel::MeshDim dim, const std::vector<bool>& merged,
                                  const std::vector<std::vector<size_t>>& shards) {
  auto& group = trainer_.mesh().group(dim);
  if (group.size() == 1) return absl::OkStatus();
  auto mask = torch::zeros({int64_t(merged.size())}, torch::kFloat);
  for (size_t f = 0; f < merged.size(); ++f) mask[int64_t(f)] = merged[f] ? 1.0f : 0.0f;
  // On the parameters' device: NCCL groups take device tensors only.
  mask = mask.to(trainer_.sharded().shards().front().value.device());
  ATL_RETURN_IF_ERROR(group.Broadcast(mask, 0));
  mask = mask.to(torch::kCPU);
  for (size_t f = 0; f < shards.size(); ++f) {
    if (mask[int64_t(f)].item<float>() == 0) continue;
    ATL_RETURN_IF_ERROR(trainer_.sharded().BroadcastShards(dim, shards[f]));
  }
  return absl::OkStatus();
}

std::vector<outer::FragmentShare> ShardModel::Shares() const {
  std::vector<outer::FragmentShare> out;
  for (size_t f = 0; f < pieces_.size(); ++f) {
    outer::FragmentShare share;
    share.elements = elements_[f];
    share.carried = !pieces_[f].empty();
    for (const Piece& p : pieces_[f]) {
      if (!share.ranges.empty() && share.ranges.back().second == p.begin) {
        share.ranges.back().second += p.count;
      } else {
        share.ranges.emplace_back(p.begin, p.begin + p.count);
      }
    }
    out.push_back(std::move(share));
  }
  return out;
}

at::Tensor ShardModel::Part(const Piece& p) { return PartOf(trainer_, p); }

namespace {

// The moment channel an optimizer state is (-1: none).
int MomentChannel(const std::string& kind) {
  if (kind == "exp_avg" || kind == "momentum") return 0;
  return kind == "exp_avg_sq" ? 1 : -1;
}

}  // namespace

std::string ShardModel::moment_optimizer() const {
  using inner::parallel::MeshDim;
  auto& mesh = trainer_.mesh();
  if (mesh.group(MeshDim::kTp).size() > 1 || mesh.group(MeshDim::kDpReplicate).size() > 1) {
    return "";
  }
  return inner::ConfigValueText(trainer_.optim_config().name);
}

std::vector<float> ShardModel::MomentSnapshot(uint32_t f) {
  uint64_t owned = 0;
  for (const Piece& p : pieces_[f]) owned += p.count;
  std::vector<float> out(outer::kMomentChannels * owned, 0.0f);
  uint64_t at = 0;
  for (const Piece& p : pieces_[f]) {
    for (const auto& state : trainer_.optimizer().ShardState(p.shard)) {
      const int c = MomentChannel(state.name);
      if (c < 0) continue;
      auto v = state.tensor.narrow(0, int64_t(p.at), int64_t(p.count))
                   .to(torch::kCPU, torch::kFloat)
                   .contiguous();
      std::copy(v.data_ptr<float>(), v.data_ptr<float>() + p.count,
                out.data() + uint64_t(c) * owned + at);
    }
    at += p.count;
  }
  return out;
}

void ShardModel::LoadMoments(uint32_t f, const std::vector<float>& moments) {
  torch::NoGradGuard no_grad;
  const uint64_t owned = moments.size() / outer::kMomentChannels;
  uint64_t at = 0;
  for (const Piece& p : pieces_[f]) {
    for (const auto& state : trainer_.optimizer().ShardState(p.shard)) {
      const int c = MomentChannel(state.name);
      if (c < 0) continue;
      auto src = torch::from_blob(const_cast<float*>(moments.data() + uint64_t(c) * owned + at),
                                  {int64_t(p.count)}, torch::kFloat);
      state.tensor.narrow(0, int64_t(p.at), int64_t(p.count)).copy_(src);
    }
    at += p.count;
  }
  // Moments of a run's steps, bias-corrected as such: a fresh optimizer's first steps would
  // otherwise divide them by 1 - beta^t as if they were its own few.
  auto& optimizer = trainer_.optimizer();
  optimizer.SetStep(std::max(optimizer.step(), trainer_.step()));
}

absl::StatusOr<ShardModel> MapFragments(const pb::JoinResponse& joined,
                                        inner::Trainer& trainer) {
  const auto& shards = trainer.sharded().shards();
  std::map<std::string, std::vector<size_t>> shards_of;  // a parameter's shard on this rank
  for (size_t i = 0; i < shards.size(); ++i) shards_of[shards[i].name].push_back(i);
  std::map<std::string, uint64_t> numel;
  for (const auto& [name, count] : inner::ParameterShapes(trainer.model()->config())) {
    numel[name] = 1;
    for (int64_t d : count) numel[name] *= uint64_t(d);
  }
  // A replica of the shards (HSDP) carries nothing: replica 0 pushes and receives for it. A rank
  // may also own no part of a fragment (a pipeline stage without its blocks): it carries nothing
  // of that one, and the island's other ranks cover it.
  const bool copy = trainer.mesh().coordinate(inner::parallel::MeshDim::kDpReplicate) > 0;
  std::vector<std::vector<ShardModel::Piece>> pieces;
  std::vector<std::vector<size_t>> whole_parts, all_parts;
  std::vector<uint64_t> elements;
  size_t covered = 0;
  for (const auto& f : joined.fragments()) {
    std::vector<ShardModel::Piece> mine;
    std::vector<size_t> whole, all;
    uint64_t offset = 0;
    for (const auto& name : f.parameters()) {
      auto it = numel.find(name);
      if (it == numel.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the service's parameter ", outer::Printable(name), " is not in this model"));
      }
      for (size_t i : shards_of[name]) {
        all.push_back(i);
        if (inner::PlanOf(trainer.sharded().plan(), name).style == inner::TpStyle::kReplicated) {
          whole.push_back(i);
        }
        if (shards[i].replica || copy) continue;
        uint64_t at = 0;
        for (const auto& [first, count] : shards[i].runs) {
          mine.push_back({i, at, offset + uint64_t(first), uint64_t(count)});
          at += uint64_t(count);
        }
      }
      offset += it->second;
      ++covered;
    }
    if (offset != f.num_elements()) {
      return absl::FailedPreconditionError("the service's fragment sizes differ from this model's");
    }
    pieces.push_back(std::move(mine));
    whole_parts.push_back(std::move(whole));
    all_parts.push_back(std::move(all));
    elements.push_back(offset);
  }
  if (covered != numel.size() || pieces.size() != joined.schedule().num_fragments()) {
    return absl::FailedPreconditionError("the service's parameter layout differs from this model's");
  }
  return ShardModel(trainer, std::move(pieces), std::move(whole_parts), std::move(all_parts),
                    std::move(elements));
}


}  // namespace atl
