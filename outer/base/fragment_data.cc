#include "outer/base/fragment_data.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"

namespace atl::outer {
namespace {

constexpr size_t kNormSpan = size_t(1) << 20;

// Scratch space of a worker thread, kept between tasks (a chunk of the update is a few MB).
std::vector<float>& Scratch(int which, size_t n) {
  thread_local std::vector<float> buffers[2];
  auto& b = buffers[which];
  if (b.size() < n) b.resize(n);
  return b;
}

// Decodes a chunk made by PrepareUpdate (well formed by construction) into out.
absl::Status DecodeChunk(const compression::CodecSpec& codec, const pb::Chunk& chunk, float* out) {
  const auto& h = chunk.header();
  return compression::Decode(codec, reinterpret_cast<const uint8_t*>(chunk.data().data()),
                             chunk.data().size(), h.num_elements(), out);
}

void ForEach(WorkerPool* pool, size_t n, const std::function<void(size_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else {
    for (size_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace

FragmentData::FragmentData(std::vector<float> params, const OuterOptimizerConfig& config)
    : params_(std::move(params)), optimizer_(MakeOuterOptimizer(config, params_.size())) {}

absl::StatusOr<std::vector<pb::Chunk>> FragmentData::PrepareUpdate(
    const float* g, const PayloadId& id, const compression::CodecSpec& codec, size_t chunk_bytes,
    WorkerPool* pool) const {
  const uint64_t n = params_.size();
  const Encoding encoding = UpdateEncoding(codec);
  const ChunkPlan plan = PlanChunks(encoding.PlanSpec(), n, chunk_bytes);
  std::vector<pb::Chunk> chunks(plan.num_chunks);
  std::vector<absl::Status> status(plan.num_chunks);
  ForEach(pool, plan.num_chunks, [&](size_t c) {
    const uint64_t first = c * plan.per_chunk, count = std::min(plan.per_chunk, n - first);
    float* u = Scratch(0, count).data();
    optimizer_->Preview(g + first, u, first, count);
    const compression::CodecSpec spec = encoding.Choose(u, count);
    auto chunk = EncodeChunk(id, spec, u, first, count, n, uint32_t(c), plan.num_chunks);
    if (!chunk.ok()) {
      status[c] = absl::InvalidArgumentError(
          absl::StrCat("the outer update is not finite (", chunk.status().message(), ")"));
      return;
    }
    float* d = Scratch(1, count).data();
    if (auto s = DecodeChunk(spec, *chunk, d); !s.ok()) {
      status[c] = s;
      return;
    }
    const float* p = params_.data() + first;
    uint32_t bad = 0;
    for (uint64_t i = 0; i < count; ++i) bad |= uint32_t(!std::isfinite(p[i] - d[i]));
    if (bad) {
      status[c] = absl::InvalidArgumentError(
          "the update would make the global parameters non-finite");
      return;
    }
    chunks[c] = *std::move(chunk);
  });
  for (auto& s : status) {
    if (!s.ok()) return s;
  }
  return chunks;
}

void FragmentData::Apply(const float* g, const std::vector<pb::Chunk>& update, WorkerPool* pool) {
  ForEach(pool, update.size(), [&](size_t c) {
    const auto& h = update[c].header();
    const uint64_t first = h.offset(), count = h.num_elements();
    optimizer_->Advance(g + first, first, count);
    float* d = Scratch(1, count).data();
    // Made by PrepareUpdate and decoded there already: it decodes.
    DecodeChunk(*SpecOf(update[c].header()), update[c], d).IgnoreError();
    ApplyUpdate(params_.data() + first, d, count);
  });
  optimizer_->EndStep();
}

absl::Status FragmentData::StepLinear(const float* g, WorkerPool* pool) {
  const size_t n = params_.size(), spans = NumSpans(n, kNormSpan);
  const float lr = float(optimizer_->lr());
  // Checked first, span by span, then applied: u is recomputed (a multiply) rather than kept.
  std::vector<uint8_t> bad(spans, 0);
  ForEach(pool, spans, [&](size_t t) {
    const size_t first = t * kNormSpan, count = std::min(n, first + kNormSpan) - first;
    float* u = Scratch(0, count).data();
    LinearStep(lr, g + first, u, count);
    const float* p = params_.data() + first;
    uint32_t any = 0;
    for (size_t i = 0; i < count; ++i) any |= uint32_t(!std::isfinite(p[i] - u[i]));
    bad[t] = uint8_t(any);
  });
  for (uint8_t b : bad) {
    if (b) return absl::InvalidArgumentError("the update would make the global parameters non-finite");
  }
  ForEach(pool, spans, [&](size_t t) {
    const size_t first = t * kNormSpan, count = std::min(n, first + kNormSpan) - first;
    float* u = Scratch(0, count).data();
    LinearStep(lr, g + first, u, count);
    optimizer_->Advance(g + first, first, count);
    ApplyUpdate(params_.data() + first, u, count);
  });
  optimizer_->EndStep();
  return absl::OkStatus();
}

uint64_t FragmentData::Hash() const {
  return compression::Checksum(params_.data(), params_.size() * sizeof(float));
}

uint64_t FragmentData::RangeHash(uint64_t begin, uint64_t end) const {
  return compression::Checksum(params_.data() + begin, (end - begin) * sizeof(float));
}

double FragmentData::Norm(WorkerPool* pool) const {
  const size_t n = params_.size(), spans = NumSpans(n, kNormSpan);
  std::vector<double> sums(spans, 0.0);
  ForEach(pool, spans, [&](size_t t) {
    const size_t first = t * kNormSpan, last = std::min(n, first + kNormSpan);
    double sum = 0;
    for (size_t i = first; i < last; ++i) sum += double(params_[i]) * double(params_[i]);
    sums[t] = sum;
  });
  double total = 0;
  for (double s : sums) total += s;
  return std::sqrt(total);
}

void FragmentData::Reset(std::vector<float> params, std::unique_ptr<OuterOptimizer> optimizer) {
  params_ = std::move(params);
  optimizer_ = std::move(optimizer);
}

std::vector<pb::Chunk> ZeroUpdate(const PayloadId& id, const compression::CodecSpec& codec,
                                  uint64_t n, size_t chunk_bytes) {
  const Encoding encoding = UpdateEncoding(codec);
  const ChunkPlan plan = PlanChunks(encoding.PlanSpec(), n, chunk_bytes);
  const std::vector<float> zeros(std::min<uint64_t>(plan.per_chunk, n), 0.0f);
  std::vector<pb::Chunk> chunks;
  for (uint32_t c = 0; c < plan.num_chunks; ++c) {
    const uint64_t first = c * plan.per_chunk, count = std::min(plan.per_chunk, n - first);
    // Zeros encode with every codec.
    chunks.push_back(*EncodeChunk(id, encoding.Choose(zeros.data(), count), zeros.data(), first,
                                  count, n, c, plan.num_chunks));
  }
  return chunks;
}

}  // namespace atl::outer
