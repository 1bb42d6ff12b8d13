// The island's receipt of a committed round: the update (encoded, or relayed contributions made
// into it here) applied chunk by chunk to the global copy, on every lane at once, and checked
// against the service's hashes.
#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/status_macros.h"
#include "outer/base/outer_optimizer.h"
#include "outer/base/update_recipe.h"
#include "outer/island/island_sync.h"
#include "outer/island/island_sync_internal.h"

namespace atl::outer {

using internal::FirstError;
using internal::RunLanes;

// Accepted chunks as they arrived (encoded), for the device copy: owned elements [at, at + count).
struct IslandSync::Received {
  absl::Status status;
  uint64_t bytes = 0, params_hash = 0;
  uint32_t contributors = 0;
  uint64_t run_tokens = 0;
  struct Owned {
    uint64_t at = 0, count = 0;
    compression::CodecSpec spec;
    std::string data;
  };
  std::vector<Owned> chunks;
};

std::vector<IslandSync::Span> IslandSync::PlanReceive(bool split) const {
  std::vector<Span> parts;
  if (split) {
    const uint64_t block = std::max<uint32_t>(1, options_.codec.block_size);
    const uint64_t blocks = (n_ + block - 1) / block;
    const uint64_t k = std::min<uint64_t>(uint64_t(lanes()), blocks);
    for (uint64_t g = 0; g < k; ++g) {
      const uint64_t b = std::min(n_, blocks * g / k * block);
      const uint64_t e = std::min(n_, blocks * (g + 1) / k * block);
      if (e > b) parts.push_back({b, b, e});
    }
    return parts;
  }
  for (uint64_t at = 0, r = 0; r < ranges_.size(); ++r) {
    parts.push_back({at, ranges_[r].first, ranges_[r].second});
    at += ranges_[r].second - ranges_[r].first;
  }
  return parts;
}

pb::UpdateRequest IslandSync::UpdateRequestFor(const Span& p, uint64_t round, bool split,
                                               bool holds_own) const {
  pb::UpdateRequest request;
  request.set_run_id(run_id_);
  request.set_island_id(island_id_);
  request.set_session(identity_->session());
  request.set_round(round);
  request.set_fragment(options_.fragment);
  request.set_offset(whole() && !split ? 0 : p.begin);
  request.set_num_elements(whole() && !split ? 0 : p.end - p.begin);
  request.set_holds_own(holds_own);
  return request;
}

absl::Status IslandSync::ReceiveOnce(const pb::UpdateRequest& request, const Span& p,
                                     int lane, std::vector<float>& next, Received& got,
                                     uint64_t* range_hash) {
  const uint64_t round = request.round();
  // Each chunk is applied as it arrives; a retry starts again from the global copy.
  std::copy(global_.begin() + int64_t(p.at), global_.begin() + int64_t(p.at + p.end - p.begin),
            next.begin() + int64_t(p.at));
  got.bytes = 0;
  got.chunks.clear();
  Assembler assembler({run_id_, "", round, options_.fragment}, fragment_elements_, p.begin,
                      p.end - p.begin, UpdateEncoding(options_.codec),
                      [&](uint64_t first, const float* u, uint64_t k) {
                        ApplyUpdate(next.data() + p.at + (first - p.begin), u, size_t(k));
                      });
  // A relayed update (its messages carry a recipe) is made here once all of it has arrived.
  std::optional<RelayReceiver> relay;
  bool encoded = false;
  ATL_RETURN_IF_ERROR(transport_->AwaitUpdate(
      request,
      [&](pb::UpdateChunk&& c) {
        got.bytes += c.ByteSizeLong();
        *range_hash = c.range_hash();
        got.params_hash = c.params_hash();
        got.contributors = c.contributors();
        got.run_tokens = c.run_tokens();
        if (c.has_recipe() != relay.has_value() && (relay.has_value() || encoded)) {
          return absl::InvalidArgumentError("an update mixes relayed and encoded chunks");
        }
        if (c.has_recipe()) {
          if (!relay) {
            relay.emplace(PayloadId{run_id_, island_id_, round, options_.fragment},
                          options_.codec, fragment_elements_, p.begin, p.end,
                          request.holds_own() ? &own_ : nullptr);
          }
          return relay->Add(std::move(c));
        }
        encoded = true;
        absl::Status added = assembler.Add(c.chunk());
        if (added.ok() && device_) {
          const auto& h = c.chunk().header();
          got.chunks.push_back({p.at + (h.offset() - p.begin), h.num_elements(), *SpecOf(h),
                                std::move(*c.mutable_chunk()->mutable_data())});
        }
        return added;
      },
      lane));
  if (!relay) return assembler.CheckComplete();
  ATL_ASSIGN_OR_RETURN(const std::vector<float> u, relay->Finish());
  ApplyUpdate(next.data() + p.at, u.data(), u.size());
  if (device_) {
    // The device copy subtracts the same u (exact in fp32).
    got.chunks.push_back({p.at, u.size(), {compression::Codec::kFp32, 0},
                          std::string(reinterpret_cast<const char*>(u.data()),
                                      u.size() * sizeof(float))});
  }
  return absl::OkStatus();
}

void IslandSync::ReceivePart(const Span& p, uint64_t round, bool split, int lane,
                             std::vector<float>& next, Received& got) {
  const bool holds_own = own_round_ == round && !own_.chunks.empty();
  const pb::UpdateRequest request = UpdateRequestFor(p, round, split, holds_own);
  uint64_t range_hash = 0;
  got.status = ReceiveOnce(request, p, lane, next, got, &range_hash);
  for (int tries = 0; tries < options_.retries && (absl::IsUnavailable(got.status) ||
                                                   absl::IsResourceExhausted(got.status));
       ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << tries));
    got.status = ReceiveOnce(request, p, lane, next, got, &range_hash);
  }
  if (!got.status.ok() || split) return;
  if (range_hash == 0) {
    got.status = absl::FailedPreconditionError(absl::StrCat(
        "the service did not know the range [", p.begin, ", ", p.end, ") at round ", round));
  } else if (compression::ParamsHash(next.data() + p.at, p.begin, p.end - p.begin) != range_hash) {
    got.status = absl::DataLossError(absl::StrCat("global parameters [", p.begin, ", ", p.end,
                                                  ") after round ", round,
                                                  " do not match the service's hash"));
  }
}

absl::Status IslandSync::CheckSplitHash(const std::vector<Received>& received, uint64_t round,
                                        const std::vector<float>& next) const {
  for (const auto& r : received) {
    if (r.params_hash != received[0].params_hash) {
      return absl::DataLossError("the parts of an update disagree on the parameters' hash");
    }
  }
  if (compression::ParamsHash(next.data(), 0, n_) != received[0].params_hash) {
    return absl::DataLossError(absl::StrCat("global parameters after round ", round,
                                            " do not match the service's hash"));
  }
  return absl::OkStatus();
}

absl::Status IslandSync::ApplyRound(uint64_t round, RoundOutcome& out) {
  const bool split = whole() && lanes() > 1;
  const std::vector<Span> parts = PlanReceive(split);
  std::vector<float> next = global_;
  std::vector<Received> received(parts.size());
  const int n_lanes = int(std::min<size_t>(size_t(lanes()), parts.size()));
  RunLanes(n_lanes, [&](int lane) {
    for (size_t i = size_t(lane); i < parts.size(); i += size_t(n_lanes)) {
      ReceivePart(parts[i], round, split, lane, next, received[i]);
    }
  });
  std::vector<absl::Status> statuses;
  for (const auto& r : received) {
    statuses.push_back(r.status);
    out.bytes_received += r.bytes;
  }
  ATL_RETURN_IF_ERROR(FirstError(statuses));
  if (split) ATL_RETURN_IF_ERROR(CheckSplitHash(received, round, next));
  if (!options_.async) out.contributors = received[0].contributors;
  out.tokens_committed = std::max(out.tokens_committed, received[0].run_tokens);
  global_ = std::move(next);
  round_ = round + 1;
  if (device_) {
    // The same chunks, decoded on the device: its copy stays equal to the one just checked. Should
    // it fail there, the full state reloads both.
    for (const auto& r : received) {
      for (const auto& c : r.chunks) {
        if (auto s = device_->Apply(c.spec, c.at, c.count, c.data); !s.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("the device copy could not apply round ", round, ": ", s.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
