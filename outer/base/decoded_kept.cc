#include "outer/base/decoded_kept.h"

#include <algorithm>
#include <mutex>

#include "compression/codec.h"
#include "compression/span_math.h"
#include "compression/status_macros.h"

namespace atl::outer {

uint64_t DecodedKept::capacity_bytes() const {
  return sizeof(uint32_t) * (begin.capacity() + index.capacity()) + sizeof(float) * value.capacity();
}

struct KeptBudget::State {
  std::mutex mu;
  uint64_t cap = 0;
  uint64_t bytes = 0, in_use = 0;
  std::vector<std::unique_ptr<DecodedKept>> free;  // cleared, with their capacity
};

KeptBudget::KeptBudget(uint64_t bytes) : state_(std::make_shared<State>()) { state_->cap = bytes; }

uint64_t KeptBudget::bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bytes;
}

uint64_t KeptBudget::in_use() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->in_use;
}

std::shared_ptr<DecodedKept> KeptBudget::Take(uint64_t blocks, uint64_t values) {
  // What a DecodedKept holds once it has room for these (reserve keeps a larger capacity).
  auto room = [&](const DecodedKept& k) {
    return sizeof(uint32_t) * (std::max<uint64_t>(k.begin.capacity(), blocks + 1) +
                               std::max<uint64_t>(k.index.capacity(), values)) +
           sizeof(float) * std::max<uint64_t>(k.value.capacity(), values);
  };
  State& st = *state_;
  std::unique_ptr<DecodedKept> kept;
  uint64_t counted = 0;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    // A kept one (they are alike: a wire chunk's values each), grown if need be; others are freed
    // while the growth does not fit.
    if (!st.free.empty()) {
      kept = std::move(st.free.back());
      st.free.pop_back();
    } else {
      kept = std::make_unique<DecodedKept>();
    }
    const uint64_t had = kept->capacity_bytes();
    counted = room(*kept);
    while (st.bytes + (counted - had) > st.cap && !st.free.empty()) {
      st.bytes -= st.free.back()->capacity_bytes();
      st.free.pop_back();
    }
    if (st.bytes + (counted - had) > st.cap) {
      if (had > 0) st.free.push_back(std::move(kept));
      return nullptr;
    }
    st.bytes += counted - had;
    st.in_use += counted;
  }
  kept->begin.reserve(blocks + 1);
  kept->index.reserve(values);
  kept->value.reserve(values);
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<DecodedKept>(kept.release(), [state, counted](DecodedKept* k) {
    k->begin.clear();
    k->index.clear();
    k->value.clear();
    std::lock_guard<std::mutex> lock(state->mu);
    state->bytes = state->bytes - counted + k->capacity_bytes();  // in case it grew
    state->in_use -= counted;
    state->free.emplace_back(k);
  });
}

absl::Status ChunkMeter::Add(const compression::CodecSpec& codec, EncodedChunk* chunk) {
  if (!failed_.ok()) return failed_;
  // VisitKept over the chunks in order visits the codec chunks a visit over the payload's ranges
  // visits, in order: the same sums as Measure.
  const uint64_t block = codec.block_size;
  const uint64_t blocks = (chunk->count + block - 1) / block;
  const uint64_t most = blocks * codec.topk;  // a short last codec chunk keeps fewer
  std::shared_ptr<DecodedKept> kept = budget_ != nullptr ? budget_->Take(blocks, most) : nullptr;
  failed_ = compression::VisitKept(
      codec, reinterpret_cast<const uint8_t*>(chunk->data.data()), chunk->data.size(),
      chunk->count, 0, chunk->count,
      [&](size_t base, const uint32_t* index, const float* value, size_t m) {
        stats_.sum_squares += compression::SumSquares(value, m);
        max_abs_ = std::max(max_abs_, compression::MaxAbs(value, m));
        if (kept == nullptr) return;
        while (kept->begin.size() <= base / block) {
          kept->begin.push_back(uint32_t(kept->index.size()));
        }
        kept->index.insert(kept->index.end(), index, index + m);
        kept->value.insert(kept->value.end(), value, value + m);
      });
  if (!failed_.ok()) return failed_;
  if (kept != nullptr) {
    kept->begin.resize(blocks + 1, uint32_t(kept->index.size()));
    chunk->kept = std::move(kept);
  }
  return absl::OkStatus();
}

absl::StatusOr<PayloadStats> ChunkMeter::Result() const {
  if (!failed_.ok()) return failed_;
  PayloadStats s = stats_;
  s.max_abs = max_abs_;
  return s;
}

absl::StatusOr<PayloadStats> MeasureAndKeep(EncodedPayload* payload, KeptBudget* budget) {
  if (!payload->codec.sparse() || budget == nullptr) return Measure(*payload);
  ChunkMeter meter(budget);
  for (EncodedChunk& c : payload->chunks) ATL_RETURN_IF_ERROR(meter.Add(payload->codec, &c));
  return meter.Result();
}

void ReplayKept(const DecodedKept& kept, uint64_t block, uint64_t within, uint64_t take,
                const EncodedPayload::KeptVisitor& visit) {
  const uint64_t end = within + take;
  for (uint64_t b = within / block; b * block < end; ++b) {
    const uint64_t start = b * block;
    const uint32_t* index = kept.index.data() + kept.begin[b];
    const float* value = kept.value.data() + kept.begin[b];
    const size_t m = kept.begin[b + 1] - kept.begin[b];
    size_t lo = 0, hi = m;
    if (start < within) {
      lo = size_t(std::lower_bound(index, index + m, uint32_t(within - start)) - index);
    }
    if (start + block > end) {
      hi = size_t(std::lower_bound(index, index + m, uint32_t(end - start)) - index);
    }
    if (hi > lo) visit(start, index + lo, value + lo, hi - lo);
  }
}

}  // namespace atl::outer
