// IslandSync's moments (outer.moment_sync_every): this rank's owned ranges of both moment
// channels pushed as one stream, and the service's average fetched piece by piece.
#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "compression/status_macros.h"
#include "outer/island/island_sync.h"
#include "outer/island/island_sync_internal.h"

namespace atl::outer {

namespace {

// A run of owned elements of one channel: where it is in the rank's channel-major values and in
// the fragment's moment layout.
struct MomentSpan {
  uint64_t at = 0;      // in the rank's values
  uint64_t offset = 0;  // in the layout's kMomentChannels x N elements
  uint64_t count = 0;
};

std::vector<MomentSpan> MomentSpans(const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                                    uint64_t owned, uint64_t fragment_elements, uint64_t piece) {
  std::vector<MomentSpan> spans;
  for (uint32_t c = 0; c < kMomentChannels; ++c) {
    uint64_t at = c * owned;
    for (const auto& [begin, end] : ranges) {
      for (uint64_t b = begin; b < end; b += piece) {
        const uint64_t count = std::min(piece, end - b);
        spans.push_back({at + (b - begin), c * fragment_elements + b, count});
      }
      at += end - begin;
    }
  }
  return spans;
}

}  // namespace

absl::StatusOr<uint64_t> IslandSync::PushMoments(const std::string& optimizer,
                                                 const std::vector<float>& moments,
                                                 uint64_t round, uint64_t step) {
  if (!carried()) return uint64_t(0);
  if (moments.size() != kMomentChannels * n_) {
    return absl::InvalidArgumentError(absl::StrCat("moments have ", moments.size(),
                                                   " elements, expected ", kMomentChannels * n_));
  }
  // The stream's chunks: each span cut on the codec's chunk plan, numbered through the push.
  std::vector<MomentSpan> chunks;
  for (const MomentSpan& s : MomentSpans(ranges_, n_, fragment_elements_, n_ + 1)) {
    const ChunkPlan plan = PlanChunks(kMomentCodec, s.count, options_.chunk_bytes);
    for (uint32_t c = 0; c < plan.num_chunks; ++c) {
      const uint64_t first = uint64_t(c) * plan.per_chunk;
      chunks.push_back({s.at + first, s.offset + first, std::min(plan.per_chunk, s.count - first)});
    }
  }
  const PayloadId id{run_id_, island_id_, round, options_.fragment};
  const uint64_t total = kMomentChannels * fragment_elements_;
  uint64_t bytes = 0;
  auto source = [&]() -> PushSource {
    bytes = 0;
    return [&, next = size_t(0)](pb::PushRequest* out) mutable -> absl::StatusOr<bool> {
      if (next == chunks.size()) return false;
      const MomentSpan& c = chunks[next];
      ATL_ASSIGN_OR_RETURN(auto chunk,
                           EncodeChunk(id, kMomentCodec, moments.data() + c.at, c.offset, c.count,
                                       total, uint32_t(next), uint32_t(chunks.size())));
      *out->mutable_chunk() = std::move(chunk);
      if (next == 0) {
        out->set_session(identity_->session());
        out->set_moments(optimizer);
        out->set_step(step);
      }
      bytes += out->ByteSizeLong();
      ++next;
      return true;
    };
  };
  ATL_RETURN_IF_ERROR(PushRetrying(source, 0).status());
  return bytes;
}

absl::StatusOr<std::vector<float>> IslandSync::FetchMoments(const std::string& optimizer,
                                                            uint64_t round, uint64_t* bytes) {
  std::vector<float> values(kMomentChannels * n_);
  if (!carried()) return values;
  const uint64_t piece = std::max<uint64_t>(1, options_.fetch_piece_bytes / sizeof(uint16_t));
  const uint64_t total = kMomentChannels * fragment_elements_;
  for (const MomentSpan& s : MomentSpans(ranges_, n_, fragment_elements_, piece)) {
    pb::FetchStateRequest request;
    request.set_run_id(run_id_);
    request.set_island_id(island_id_);
    request.set_session(identity_->session());
    request.set_fragment(options_.fragment);
    request.set_offset(s.offset);
    request.set_num_elements(s.count);
    request.set_moments(optimizer);
    for (int tries = 0;; ++tries) {
      request.set_moments_round(round);  // 0 until a piece has named the newest
      std::optional<Assembler> assembler;
      uint64_t got = 0;
      absl::Status status = transport_->FetchState(
          request,
          [&](pb::StateChunk&& c) -> absl::Status {
            if (!assembler) {
              // Every piece is of one round: the first names it when the newest was asked for.
              const uint64_t served = c.chunk().header().round();
              if (round == 0) round = served;
              if (served != round) {
                return absl::AbortedError(absl::StrCat("the service's moments moved from round ",
                                                       round, " to ", served));
              }
              assembler.emplace(PayloadId{run_id_, "", served, options_.fragment}, total,
                                s.offset, s.count, kMomentCodec,
                                [&](uint64_t first, const float* v, uint64_t k) {
                                  std::copy(v, v + k, values.data() + s.at + (first - s.offset));
                                });
            }
            got += c.ByteSizeLong();
            return assembler->Add(c.chunk());
          },
          0);
      if (status.ok() && !assembler) status = absl::DataLossError("the service sent no moments");
      if (status.ok()) status = assembler->CheckComplete();
      if (status.ok()) {
        if (bytes != nullptr) *bytes += got;
        break;
      }
      if (!internal::Transient(status) || tries >= options_.retries) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 << (tries + 1), 2000)));
    }
  }
  return values;
}

}  // namespace atl::outer
