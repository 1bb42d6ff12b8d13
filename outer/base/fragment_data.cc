#include "outer/base/fragment_data.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec.h"
#include "compression/span_math.h"
#include "compression/status_macros.h"

namespace atl::outer {
namespace {

constexpr size_t kNormSpan = size_t(1) << 20;
constexpr size_t kSparseTask = size_t(1) << 16;  // entries of a sparse change per task

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


// The buffer chunk c of an update is encoded into (null: a fresh one).
std::string* SpareFor(SpareChunkData* spare, size_t c) {
  return spare != nullptr ? spare->For(c) : nullptr;
}

}  // namespace

FragmentData::FragmentData(std::vector<float> params, const OuterOptimizerConfig& config)
    : params_(std::move(params)), optimizer_(MakeOuterOptimizer(config, params_.size())) {
  Remeasure();
}

absl::StatusOr<std::vector<pb::Chunk>> FragmentData::PrepareUpdate(
    const float* g, const PayloadId& id, const compression::CodecSpec& codec, size_t chunk_bytes,
    WorkerPool* pool, SpareChunkData* spare) const {
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
    auto chunk = EncodeChunk(id, spec, u, first, count, n, uint32_t(c), plan.num_chunks, {},
                             SpareFor(spare, c));
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
  std::vector<Tally> tallies(update.size());
  ForEach(pool, update.size(), [&](size_t c) {
    const auto& h = update[c].header();
    const uint64_t first = h.offset(), count = h.num_elements();
    optimizer_->Advance(g + first, first, count);
    float* d = Scratch(1, count).data();
    // Made by PrepareUpdate and decoded there already: it decodes.
    DecodeChunk(*SpecOf(update[c].header()), update[c], d).IgnoreError();
    ApplyUpdate(params_.data() + first, d, count);
    Measure(first, count, &tallies[c]);  // while the chunk is in cache
  });
  optimizer_->EndStep();
  Replace(tallies);
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
  std::vector<Tally> tallies(spans);
  ForEach(pool, spans, [&](size_t t) {
    const size_t first = t * kNormSpan, count = std::min(n, first + kNormSpan) - first;
    float* u = Scratch(0, count).data();
    LinearStep(lr, g + first, u, count);
    optimizer_->Advance(g + first, first, count);
    ApplyUpdate(params_.data() + first, u, count);
    Measure(first, count, &tallies[t]);
  });
  optimizer_->EndStep();
  Replace(tallies);
  return absl::OkStatus();
}

namespace {

// Calls fn(index, value, m) for the runs of g's entries inside elements [first, last), in order.
template <typename Fn>
void ForEachRun(const SparseGradient& g, uint64_t first, uint64_t last, Fn&& fn) {
  const size_t from = g.span > 0 ? size_t(std::min<uint64_t>(first / g.span, g.pieces.size())) : 0;
  for (size_t p = from; p < g.pieces.size(); ++p) {
    const auto& piece = g.pieces[p];
    if (piece.index.empty() || piece.index.back() < first) continue;
    if (piece.index.front() >= last) break;
    const auto lo = std::lower_bound(piece.index.begin(), piece.index.end(), first);
    const auto hi = std::lower_bound(lo, piece.index.end(), last);
    const size_t at = size_t(lo - piece.index.begin());
    if (hi > lo) fn(piece.index.data() + at, piece.value.data() + at, size_t(hi - lo));
  }
}

float MaxAbsOf(const SparseGradient& g) {
  float m = 0;
  for (const auto& p : g.pieces) m = std::max(m, compression::MaxAbs(p.value.data(), p.value.size()));
  return m;
}

}  // namespace

bool FragmentData::SurelyFinite(float max_abs) const {
  return double(max_abs_bound_) + double(max_abs) < double(std::numeric_limits<float>::max());
}

absl::StatusOr<pb::Chunk> FragmentData::EncodeSparseChunk(
    const SparseGradient& g, const SparsePlan& plan, size_t c,
    const compression::KeptVisitor& decoded, std::string* storage) const {
  const uint64_t n = params_.size();
  const uint64_t first = c * plan.chunks.per_chunk;
  const uint64_t count = std::min(plan.chunks.per_chunk, n - first);
  // u = LinearStep(lr, g) at g's entries in the chunk (Preview of a linear step), zero elsewhere.
  thread_local std::vector<uint32_t> idx_buffer;
  thread_local std::vector<float> u_buffer;
  size_t entries = 0;
  ForEachRun(g, first, first + count, [&](const uint64_t*, const float*, size_t m) { entries += m; });
  if (idx_buffer.size() < entries) {  // grown, never shrunk: no fill per chunk
    idx_buffer.resize(entries);
    u_buffer.resize(entries);
  }
  uint32_t* const idx = idx_buffer.data();
  float* const u = u_buffer.data();
  size_t held = 0;
  ForEachRun(g, first, first + count, [&](const uint64_t* index, const float* value, size_t m) {
    for (size_t j = 0; j < m; ++j) idx[held + j] = uint32_t(index[j] - first);
    LinearStep(plan.lr, value, u + held, m);
    held += m;
  });
  const compression::CodecSpec spec = plan.encoding.ChooseSparse(idx, u, entries, count);
  auto chunk = EncodeChunkWith(
      plan.id, spec, first, count, n, uint32_t(c), plan.chunks.num_chunks, {},
      [&](uint8_t* out, const compression::Rounding& r) {
        if (spec.sparse()) {
          return compression::EncodeSparseInput(spec, count, idx, u, entries, out, r, &decoded);
        }
        float* dense = Scratch(0, count).data();
        std::fill(dense, dense + count, 0.0f);
        for (size_t j = 0; j < entries; ++j) dense[idx[j]] = u[j];
        return compression::Encode(spec, dense, count, out, r);
      },
      storage);
  if (!chunk.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the outer update is not finite (", chunk.status().message(), ")"));
  }
  if (!spec.sparse()) {  // dense FP4: every element, decoded
    float* d = Scratch(1, count).data();
    ATL_RETURN_IF_ERROR(DecodeChunk(spec, *chunk, d));
    thread_local std::vector<uint32_t> all;
    all.resize(count);
    std::iota(all.begin(), all.end(), 0u);
    decoded(0, all.data(), d, count);
  }
  return chunk;
}

absl::StatusOr<FragmentData::SparsePlan> FragmentData::PlanSparse(
    const PayloadId& id, const compression::CodecSpec& codec, size_t chunk_bytes) const {
  if (!optimizer_->linear()) {
    return absl::FailedPreconditionError("a sparse update needs a linear outer step");
  }
  SparsePlan plan{id, UpdateEncoding(codec), {}, float(optimizer_->lr())};
  plan.chunks = PlanChunks(plan.encoding.PlanSpec(), params_.size(), chunk_bytes);
  return plan;
}

absl::Status FragmentData::PrepareSparseUpdate(const SparseGradient& g, const PayloadId& id,
                                               const compression::CodecSpec& codec,
                                               size_t chunk_bytes, WorkerPool* pool,
                                               SparseUpdate* update,
                                               SpareChunkData* spare) const {
  ATL_ASSIGN_OR_RETURN(const SparsePlan plan, PlanSparse(id, codec, chunk_bytes));
  const uint32_t chunks = plan.chunks.num_chunks;
  update->chunks.assign(chunks, pb::Chunk());
  update->decoded.Reset(chunks);
  std::vector<absl::Status> status(chunks);
  std::vector<float> max_abs(chunks, 0.0f);
  ForEach(pool, chunks, [&](size_t c) {
    const uint64_t first = c * plan.chunks.per_chunk;
    SparseGradient::Piece& d = update->decoded.pieces[c];  // what the islands will subtract
    auto chunk = EncodeSparseChunk(g, plan, c, [&](size_t base, const uint32_t* at, const float* v,
                                                   size_t m) {
      for (size_t j = 0; j < m; ++j) d.index.push_back(first + base + at[j]);
      d.value.insert(d.value.end(), v, v + m);
    }, SpareFor(spare, c));
    if (!chunk.ok()) {
      status[c] = chunk.status();
      return;
    }
    max_abs[c] = compression::MaxAbs(d.value.data(), d.value.size());
    update->chunks[c] = *std::move(chunk);
  });
  for (auto& s : status) {
    if (!s.ok()) return s;
  }
  // Checked as PrepareUpdate checks it (elsewhere the update is zero, which changes nothing): at
  // once when no parameter can leave the floats, else element by element.
  if (!SurelyFinite(*std::max_element(max_abs.begin(), max_abs.end()))) {
    for (const auto& d : update->decoded.pieces) {
      for (size_t j = 0; j < d.index.size(); ++j) {
        if (!std::isfinite(params_[d.index[j]] - d.value[j])) {
          return absl::InvalidArgumentError(
              "the update would make the global parameters non-finite");
        }
      }
    }
  }
  return absl::OkStatus();
}

void FragmentData::ApplySparse(const SparseUpdate& update, WorkerPool* pool) {
  const auto& pieces = update.decoded.pieces;
  std::vector<Tally> tallies(pieces.size());
  ForEach(pool, pieces.size(), [&](size_t c) {
    SubtractAt(0, pieces[c].index.data(), pieces[c].value.data(), pieces[c].index.size(),
               &tallies[c]);
  });
  optimizer_->EndStep();  // a linear step: no state to advance
  AddDeltas(tallies);
}

absl::StatusOr<std::vector<pb::Chunk>> FragmentData::StepSparse(
    const SparseGradient& g, const PayloadId& id, const compression::CodecSpec& codec,
    size_t chunk_bytes, WorkerPool* pool, SparseUpdate* scratch, SpareChunkData* spare) {
  ATL_ASSIGN_OR_RETURN(const SparsePlan plan, PlanSparse(id, codec, chunk_bytes));
  // The decoded update is at most twice u in magnitude (an FP4 scale is a power of two at or
  // above amax / 6), u at most |lr| x max |g| (and an ulp).
  const float u_max = std::nextafter(std::fabs(plan.lr) * MaxAbsOf(g), INFINITY);
  if (!std::isfinite(u_max) || !SurelyFinite(4 * u_max)) {
    ATL_RETURN_IF_ERROR(PrepareSparseUpdate(g, id, codec, chunk_bytes, pool, scratch, spare));
    ApplySparse(*scratch, pool);
    return std::move(scratch->chunks);
  }
  // Nothing can fail: each chunk is subtracted as it is encoded, in one pass.
  const uint32_t chunks = plan.chunks.num_chunks;
  std::vector<pb::Chunk> update(chunks);
  std::vector<absl::Status> status(chunks);
  std::vector<Tally> tallies(chunks);
  ForEach(pool, chunks, [&](size_t c) {
    const uint64_t first = c * plan.chunks.per_chunk;
    auto chunk = EncodeSparseChunk(g, plan, c, [&](size_t base, const uint32_t* at, const float* v,
                                                   size_t m) {
      SubtractAt(first + base, at, v, m, &tallies[c]);
    }, SpareFor(spare, c));
    if (chunk.ok()) {
      update[c] = *std::move(chunk);
    } else {
      status[c] = chunk.status();  // not expected (u is finite): named all the same
    }
  });
  optimizer_->EndStep();
  AddDeltas(tallies);
  for (auto& s : status) {
    if (!s.ok()) return s;
  }
  return update;
}

absl::Status FragmentData::StepLinearSparse(const SparseGradient& g, WorkerPool* pool) {
  if (!optimizer_->linear()) {
    return absl::FailedPreconditionError("a sparse update needs a linear outer step");
  }
  const float lr = float(optimizer_->lr());
  const auto& pieces = g.pieces;
  // u = LinearStep(lr, g) is at most |lr| x max |g| in magnitude (a rounding may add an ulp).
  const float bound = std::nextafter(std::fabs(lr) * MaxAbsOf(g), INFINITY);
  if (!SurelyFinite(bound)) {
    std::vector<uint8_t> bad(pieces.size(), 0);
    ForEach(pool, pieces.size(), [&](size_t t) {
      const auto& p = pieces[t];
      float* u = Scratch(0, p.index.size()).data();
      LinearStep(lr, p.value.data(), u, p.index.size());
      uint32_t any = 0;
      for (size_t j = 0; j < p.index.size(); ++j) any |= uint32_t(!std::isfinite(params_[p.index[j]] - u[j]));
      bad[t] = uint8_t(any);
    });
    for (uint8_t b : bad) {
      if (b) return absl::InvalidArgumentError("the update would make the global parameters non-finite");
    }
  }
  std::vector<Tally> tallies(pieces.size());
  ForEach(pool, pieces.size(), [&](size_t t) {
    const auto& p = pieces[t];
    float* u = Scratch(0, p.index.size()).data();
    LinearStep(lr, p.value.data(), u, p.index.size());
    SubtractAt(0, p.index.data(), u, p.index.size(), &tallies[t]);
  });
  optimizer_->EndStep();
  AddDeltas(tallies);
  return absl::OkStatus();
}

size_t FragmentData::SegmentOf(uint64_t i) const {
  return size_t(std::upper_bound(bounds_.begin(), bounds_.end(), i) - bounds_.begin()) - 1;
}

void FragmentData::Measure(uint64_t first, uint64_t count, Tally* tally) const {
  const uint64_t last = first + count;
  for (size_t seg = SegmentOf(first); first < last; ++seg) {
    const uint64_t end = std::min(last, bounds_[seg + 1]);
    tally->sums.emplace_back(seg, compression::ParamsHashSum(params_.data() + first, first,
                                                             end - first));
    tally->squares += compression::SumSquares(params_.data() + first, end - first);
    tally->max_abs = std::max(tally->max_abs, compression::MaxAbs(params_.data() + first, end - first));
    first = end;
  }
}

void FragmentData::Replace(const std::vector<Tally>& tallies) {
  std::fill(sums_.begin(), sums_.end(), 0);
  squares_ = 0;
  max_abs_bound_ = 0;
  for (const auto& t : tallies) {
    for (const auto& [seg, sum] : t.sums) sums_[seg] += sum;
    squares_ += t.squares;
    max_abs_bound_ = std::max(max_abs_bound_, t.max_abs);
  }
}

void FragmentData::AddDeltas(const std::vector<Tally>& tallies) {
  for (const auto& t : tallies) {
    for (const auto& [seg, sum] : t.sums) sums_[seg] += sum;
    squares_ += t.squares;
    max_abs_bound_ = std::max(max_abs_bound_, t.max_abs);
  }
  squares_ = std::max(0.0, squares_);
}

template <typename Index>
void FragmentData::SubtractAt(uint64_t base, const Index* offsets, const float* d, size_t m,
                              Tally* tally) {
  // In blocks inside one segment: the parameters gathered (fetched ahead: they lie far apart),
  // the block updated at once by ApplyUpdate (as every copy applies an update) and stored back,
  // then the block's hash terms, squares and largest magnitude.
  constexpr size_t kBlock = 256, kAhead = 32;
  uint64_t at[kBlock];
  float before[kBlock], after[kBlock];
  float* const p = params_.data();
  size_t seg = m > 0 ? SegmentOf(base + offsets[0]) : 0;
  uint64_t sum = 0;
  for (size_t j = 0; j < m;) {
    size_t e = j;
    const uint64_t end = bounds_[seg + 1];
    for (; e < m && e - j < kBlock && base + offsets[e] < end; ++e) {
      if (e + kAhead < m) __builtin_prefetch(p + base + offsets[e + kAhead], 1);
      at[e - j] = base + offsets[e];
      before[e - j] = p[at[e - j]];
    }
    if (e == j) {  // the next element lies in a later segment
      tally->sums.emplace_back(seg, sum);
      sum = 0;
      while (base + offsets[j] >= bounds_[seg + 1]) ++seg;
      continue;
    }
    const size_t n = e - j;
    std::copy(before, before + n, after);
    ApplyUpdate(after, d + j, n);
    for (size_t k = 0; k < n; ++k) p[at[k]] = after[k];
    sum += compression::ParamsHashChange(at, before, after, n);
    double squares = 0;
    float max_abs = 0;
    for (size_t k = 0; k < n; ++k) {
      squares += double(after[k]) * double(after[k]) - double(before[k]) * double(before[k]);
      max_abs = std::max(max_abs, std::fabs(after[k]));
    }
    tally->squares += squares;
    tally->max_abs = std::max(tally->max_abs, max_abs);
    j = e;
  }
  if (m > 0) tally->sums.emplace_back(seg, sum);
}

void FragmentData::TrackRanges(const std::set<std::pair<uint64_t, uint64_t>>& ranges) {
  const uint64_t n = params_.size();
  std::vector<uint64_t> bounds = bounds_;
  for (const auto& [begin, end] : ranges) {
    if (begin < end && end <= n) {
      bounds.push_back(begin);
      bounds.push_back(end);
    }
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  if (bounds == bounds_) return;
  // A segment that stays keeps its sum; the pieces of one split are hashed once.
  std::vector<uint64_t> sums(bounds.size() - 1);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const auto old = std::lower_bound(bounds_.begin(), bounds_.end(), bounds[i]);
    if (old != bounds_.end() && *old == bounds[i] && old + 1 != bounds_.end() &&
        *(old + 1) == bounds[i + 1]) {
      sums[i] = sums_[size_t(old - bounds_.begin())];
    } else {
      sums[i] = compression::ParamsHashSum(params_.data() + bounds[i], bounds[i],
                                           bounds[i + 1] - bounds[i]);
    }
  }
  bounds_ = std::move(bounds);
  sums_ = std::move(sums);
}

uint64_t FragmentData::Hash() const {
  uint64_t sum = 0;
  for (uint64_t s : sums_) sum += s;
  return compression::ParamsHashOf(sum, params_.size());
}

uint64_t FragmentData::RangeHash(uint64_t begin, uint64_t end) const {
  const auto b = std::lower_bound(bounds_.begin(), bounds_.end(), begin);
  const auto e = std::lower_bound(b, bounds_.end(), end);
  if (b == bounds_.end() || *b != begin || e == bounds_.end() || *e != end) {
    return compression::ParamsHash(params_.data() + begin, begin, end - begin);  // not tracked
  }
  uint64_t sum = 0;
  for (auto i = size_t(b - bounds_.begin()); i < size_t(e - bounds_.begin()); ++i) sum += sums_[i];
  return compression::ParamsHashOf(sum, end - begin);
}

double FragmentData::Norm() const { return std::sqrt(squares_); }

void FragmentData::Reset(std::vector<float> params, std::unique_ptr<OuterOptimizer> optimizer) {
  params_ = std::move(params);
  optimizer_ = std::move(optimizer);
  Remeasure();
}

void FragmentData::Remeasure() {
  if (bounds_.empty() || bounds_.back() != params_.size()) bounds_ = {0, params_.size()};
  sums_.assign(bounds_.size() - 1, 0);
  Tally all;
  if (!params_.empty()) Measure(0, params_.size(), &all);
  Replace({all});
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
