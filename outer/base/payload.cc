#include "outer/base/payload.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/checksum.h"
#include "compression/codec_traits.h"
#include "compression/span_math.h"
#include "compression/status_macros.h"
#include "outer/base/decoded_kept.h"
#include "outer/base/names.h"

namespace atl::outer {

namespace {

const compression::CodecSpec kDenseUpdate = {compression::Codec::kFp4E2M1, 32};

compression::CodecSpec SparseUpdate(const compression::CodecSpec& run, uint32_t kept) {
  return {compression::Codec::kFp4E2M1, run.block_size, kept};
}

// The update of n elements keeping `kept` per chunk, or dense FP4 when that is smaller.
compression::CodecSpec SmallerUpdate(const compression::CodecSpec& run, uint32_t kept, uint64_t n) {
  const compression::CodecSpec sparse = SparseUpdate(run, kept);
  return compression::EncodedBytes(sparse, n) <= compression::EncodedBytes(kDenseUpdate, n)
             ? sparse
             : kDenseUpdate;
}

}  // namespace

Encoding UpdateEncoding(const compression::CodecSpec& contributions) {
  Encoding e(contributions);
  e.update = contributions.sparse();
  return e;
}

size_t UpdateBytesAtMost(const compression::CodecSpec& contributions, uint32_t contributors,
                         uint64_t n) {
  if (!contributions.sparse()) return compression::EncodedBytes(contributions, n);
  const uint64_t kept = std::min<uint64_t>(contributions.block_size,
                                           uint64_t(std::max(1u, contributors)) * contributions.topk);
  return compression::EncodedBytes(SmallerUpdate(contributions, uint32_t(kept), n), n);
}

bool Encoding::Accepts(const compression::CodecSpec& got) const {
  if (!update) return got == spec;
  return got == kDenseUpdate || (got.codec == compression::Codec::kFp4E2M1 &&
                                 got.block_size == spec.block_size && got.topk >= 1 &&
                                 got.topk <= spec.block_size);
}

std::string Encoding::Text() const {
  if (!update) return absl::StrCat(compression::SpecText(spec), "/", spec.block_size);
  return absl::StrCat("top-k/", spec.block_size, " fp4_e2m1 or fp4_e2m1/32");
}

compression::CodecSpec Encoding::PlanSpec() const {
  return update ? SparseUpdate(spec, spec.block_size) : spec;
}

compression::CodecSpec Encoding::Choose(const float* u, size_t n) const {
  if (!update) return spec;
  // The union of the contributions' indices: the most nonzeros of any chunk.
  uint32_t kept = 1;
  for (size_t first = 0; first < n; first += spec.block_size) {
    const size_t last = std::min<size_t>(n, first + spec.block_size);
    uint32_t nonzero = 0;
    for (size_t i = first; i < last; ++i) nonzero += uint32_t(u[i] != 0.0f);
    kept = std::max(kept, nonzero);
  }
  return SmallerUpdate(spec, kept, n);
}

compression::CodecSpec Encoding::ChooseSparse(const uint32_t* idx, const float* u, size_t m,
                                              size_t n) const {
  if (!update) return spec;
  // Block by block: its entries found by search, their nonzeros counted without a branch.
  uint32_t kept = 1;
  const uint32_t* const end = idx + m;
  for (const uint32_t* at = idx; at != end;) {
    const uint64_t block_end = (uint64_t(*at) / spec.block_size + 1) * spec.block_size;
    const uint32_t* next =
        block_end > UINT32_MAX ? end : std::lower_bound(at, end, uint32_t(block_end));
    const float* v = u + (at - idx);
    const size_t len = size_t(next - at);
    if (len > kept) {  // else it cannot keep more
      uint32_t nonzero = 0;
      for (size_t i = 0; i < len; ++i) nonzero += uint32_t(v[i] != 0.0f);
      kept = std::max(kept, nonzero);
    }
    at = next;
  }
  return SmallerUpdate(spec, kept, n);
}

absl::StatusOr<compression::CodecSpec> SpecOf(const pb::ChunkHeader& h) {
  return compression::MakeSpec(int(h.codec()), h.block_size(), h.topk());
}

ChunkPlan PlanChunks(const compression::CodecSpec& spec, uint64_t n, size_t max_chunk_bytes) {
  // Chunks hold whole scale blocks, so each chunk is encoded and checked on its own.
  const uint64_t unit = std::max<uint32_t>(1, spec.block_size);
  const size_t unit_bytes = std::max<size_t>(1, compression::EncodedBytes(spec, unit));
  ChunkPlan plan;
  plan.per_chunk = std::max<uint64_t>(1, max_chunk_bytes / unit_bytes) * unit;
  plan.num_chunks = uint32_t(std::max<uint64_t>(1, (n + plan.per_chunk - 1) / plan.per_chunk));
  return plan;
}

absl::StatusOr<pb::Chunk> EncodeChunk(const PayloadId& id, const compression::CodecSpec& spec,
                                      const float* values, uint64_t offset, uint64_t count,
                                      uint64_t fragment_elements, uint32_t index,
                                      uint32_t num_chunks, compression::Rounding rounding,
                                      std::string* storage) {
  return EncodeChunkWith(
      id, spec, offset, count, fragment_elements, index, num_chunks, rounding,
      [&](uint8_t* out, const compression::Rounding& r) {
        return compression::Encode(spec, values, count, out, r);
      },
      storage);
}

pb::ChunkHeader HeaderOf(const PayloadId& id, const compression::CodecSpec& spec, uint64_t offset,
                         uint64_t count, uint64_t fragment_elements, uint32_t index,
                         uint32_t num_chunks) {
  pb::ChunkHeader h;
  h.set_run_id(id.run_id);
  h.set_island_id(id.island_id);
  h.set_round(id.round);
  h.set_fragment(id.fragment);
  h.set_codec(pb::Codec(int(spec.codec)));
  h.set_block_size(spec.block_size);
  h.set_topk(spec.topk);
  h.set_offset(offset);
  h.set_num_elements(count);
  h.set_fragment_elements(fragment_elements);
  h.set_chunk_index(index);
  h.set_num_chunks(num_chunks);
  return h;
}

pb::Chunk ChunkOf(const PayloadId& id, const compression::CodecSpec& spec, const EncodedChunk& c,
                  uint64_t fragment_elements, uint32_t index, uint32_t num_chunks) {
  pb::Chunk chunk;
  *chunk.mutable_header() =
      HeaderOf(id, spec, c.offset, c.count, fragment_elements, index, num_chunks);
  chunk.set_data(c.data);
  chunk.set_xxh64(compression::Checksum(c.data.data(), c.data.size()));
  return chunk;
}

absl::StatusOr<pb::Chunk> EncodeChunkWith(const PayloadId& id, const compression::CodecSpec& spec,
                                          uint64_t offset, uint64_t count,
                                          uint64_t fragment_elements, uint32_t index,
                                          uint32_t num_chunks, compression::Rounding rounding,
                                          const ChunkEncoder& encode, std::string* storage) {
  pb::Chunk chunk;
  *chunk.mutable_header() =
      HeaderOf(id, spec, offset, count, fragment_elements, index, num_chunks);
  std::string* data = chunk.mutable_data();
  if (storage != nullptr) data->swap(*storage);  // its old bytes are all overwritten
  data->resize(compression::EncodedBytes(spec, count));
  rounding.first_index = offset;
  if (auto s = encode(reinterpret_cast<uint8_t*>(data->data()), rounding); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("element ", offset, "+: ", s.message()));
  }
  chunk.set_xxh64(compression::Checksum(data->data(), data->size()));
  return chunk;
}

absl::StatusOr<std::vector<pb::Chunk>> EncodeChunks(const PayloadId& id,
                                                    const compression::CodecSpec& spec,
                                                    const float* values, uint64_t offset,
                                                    uint64_t n, uint64_t fragment_elements,
                                                    size_t max_chunk_bytes,
                                                    compression::Rounding rounding) {
  if (offset + n > fragment_elements) {
    return absl::InvalidArgumentError(absl::StrCat("range [", offset, ", ", offset + n,
                                                   ") exceeds the fragment's ", fragment_elements,
                                                   " elements"));
  }
  const ChunkPlan plan = PlanChunks(spec, n, max_chunk_bytes);
  std::vector<pb::Chunk> out;
  out.reserve(plan.num_chunks);
  for (uint32_t c = 0; c < plan.num_chunks; ++c) {
    const uint64_t first = uint64_t(c) * plan.per_chunk;
    ATL_ASSIGN_OR_RETURN(auto chunk, EncodeChunk(id, spec, values + first, offset + first,
                                                 std::min<uint64_t>(plan.per_chunk, n - first),
                                                 fragment_elements, c, plan.num_chunks, rounding));
    out.push_back(std::move(chunk));
  }
  return out;
}

absl::Status CheckRange(uint64_t offset, uint64_t count, uint64_t total, uint32_t fragment) {
  if (offset <= total && count <= total - offset) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("elements [", offset, ", +", count,
                                            ") are outside fragment ", fragment, "'s ", total,
                                            " elements"));
}

absl::Status CheckChunk(const PayloadId& id, const Encoding& codec, uint64_t fragment_elements,
                        uint64_t begin, uint64_t end, const pb::Chunk& chunk) {
  const auto& h = chunk.header();
  const std::string where = absl::StrCat("chunk ", h.chunk_index(), " of island ",
                                         Printable(h.island_id()), " for round ", h.round(),
                                         ", fragment ", h.fragment());
  if (h.run_id() != id.run_id) {
    return absl::NotFoundError(absl::StrCat(where, ": unknown run ", Printable(h.run_id())));
  }
  if (h.island_id() != id.island_id || h.round() != id.round || h.fragment() != id.fragment) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": does not belong to the payload of island ", Printable(id.island_id),
                     ", round ", id.round, ", fragment ", id.fragment));
  }
  if (h.fragment_elements() != fragment_elements) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": fragment has ", fragment_elements,
                                                   " elements, chunk says ",
                                                   h.fragment_elements()));
  }
  auto spec = SpecOf(h);
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", spec.status().message()));
  if (!codec.Accepts(*spec)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": codec ", compression::SpecText(*spec),
                                                   "/", spec->block_size,
                                                   " does not match the run's ", codec.Text()));
  }
  const uint64_t first = h.offset(), count = h.num_elements();
  if (count == 0 || first < begin || first > end || count > end - first) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": range [", first, ", +", count,
                                                   ") is outside [", begin, ", ", end, ")"));
  }
  const size_t expected_bytes = compression::EncodedBytes(*spec, count);
  if (chunk.data().size() != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", count, " elements need ",
                                                   expected_bytes, " bytes, got ",
                                                   chunk.data().size()));
  }
  if (compression::Checksum(chunk.data().data(), chunk.data().size()) != chunk.xxh64()) {
    return absl::DataLossError(absl::StrCat(where, ": checksum mismatch"));
  }
  return absl::OkStatus();
}

pb::Chunk SliceChunk(const pb::Chunk& chunk, uint64_t first, uint64_t last) {
  const auto& h = chunk.header();
  const compression::CodecSpec spec = *SpecOf(h);  // well formed: checked when it arrived
  const uint64_t n = h.num_elements();
  const uint64_t block = std::max<uint32_t>(1, spec.block_size);
  // Elements [a, b) of the chunk, on its block grid.
  uint64_t a = first > h.offset() ? first - h.offset() : 0;
  uint64_t b = std::min(n, last - h.offset());
  a = a / block * block;
  b = std::min(n, (b + block - 1) / block * block);
  if (a == 0 && b == n) return chunk;
  // Its block data, then its elements: a payload of its own (compression/codec_traits.h).
  const compression::SliceLayout slice = compression::SliceOf(spec, n, a, b);
  const std::string& data = chunk.data();
  std::string out = data.substr(slice.blocks_offset, slice.blocks_bytes);
  out += data.substr(slice.elements_offset, slice.elements_bytes);
  pb::Chunk sliced;
  *sliced.mutable_header() = h;
  sliced.mutable_header()->set_offset(h.offset() + a);
  sliced.mutable_header()->set_num_elements(b - a);
  sliced.set_data(std::move(out));
  sliced.set_xxh64(compression::Checksum(sliced.data().data(), sliced.data().size()));
  return sliced;
}

size_t EncodedPayload::bytes() const {
  size_t b = 0;
  for (const auto& c : chunks) b += c.data.size();
  return b;
}

bool EncodedPayload::Covers(uint64_t n) const {
  uint64_t next = 0;
  for (const auto& c : chunks) {
    if (c.offset != next) return false;
    next += c.count;
  }
  return next == n;
}

std::vector<std::pair<uint64_t, uint64_t>> EncodedPayload::Ranges() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& c : chunks) {
    if (!out.empty() && out.back().second == c.offset) {
      out.back().second += c.count;
    } else {
      out.emplace_back(c.offset, c.offset + c.count);
    }
  }
  return out;
}

namespace {

// Calls part(chunk, within, take) for the pieces of elements [first, first + count) the chunks
// hold, in order: `take` elements from `within` of the chunk. DATA_LOSS where a gap is crossed.
template <typename Part>
absl::Status ForEachPart(const std::vector<EncodedChunk>& chunks, uint64_t first, uint64_t count,
                         Part&& part) {
  // The first chunk that ends after `first`.
  auto it = std::upper_bound(chunks.begin(), chunks.end(), first,
                             [](uint64_t x, const EncodedChunk& c) { return x < c.offset + c.count; });
  while (count > 0) {
    if (it == chunks.end() || it->offset > first) {
      return absl::DataLossError(absl::StrCat("payload has no chunk holding element ", first));
    }
    const uint64_t within = first - it->offset;
    const uint64_t take = std::min(count, it->count - within);
    ATL_RETURN_IF_ERROR(part(*it, within, take));
    first += take;
    count -= take;
    ++it;
  }
  return absl::OkStatus();
}

const uint8_t* BytesOf(const EncodedChunk& c) {
  return reinterpret_cast<const uint8_t*>(c.data.data());
}

}  // namespace

absl::Status EncodedPayload::Read(uint64_t first, uint64_t count, float* out) const {
  return ForEachPart(chunks, first, count, [&](const EncodedChunk& c, uint64_t within,
                                               uint64_t take) {
    absl::Status s =
        compression::DecodeSlice(codec, BytesOf(c), c.data.size(), c.count, within, take, out);
    if (absl::StartsWith(s.message(), "payload decodes to a non-finite value")) {
      // The codec names the element within its chunk: name it within the fragment.
      const float* bad = std::find_if(out, out + take, [](float v) { return !std::isfinite(v); });
      if (bad != out + take) {
        s = absl::InvalidArgumentError(
            absl::StrCat("payload decodes to a non-finite value at element ",
                         c.offset + within + uint64_t(bad - out)));
      }
    }
    out += take;
    return s;
  });
}

absl::Status EncodedPayload::VisitKept(uint64_t first, uint64_t count,
                                       const KeptVisitor& visit) const {
  return ForEachPart(chunks, first, count, [&](const EncodedChunk& c, uint64_t within,
                                               uint64_t take) {
    auto at = [&](size_t base, const uint32_t* index, const float* value, size_t m) {
      visit(c.offset + base, index, value, m);
    };
    if (c.kept != nullptr) {
      ReplayKept(*c.kept, codec.block_size, within, take, at);
      return absl::OkStatus();
    }
    return compression::VisitKept(
        codec, BytesOf(c), c.data.size(), c.count, within, take,
        [&](size_t base, const uint32_t* index, const float* value, size_t m) {
          visit(c.offset + base, index, value, m);
        });
  });
}

void EncodedPayload::DropKept() {
  for (auto& c : chunks) c.kept.reset();
}

absl::Status EncodedPayload::Merge(EncodedPayload&& other) {
  if (other.codec != codec) {
    return absl::InvalidArgumentError("payloads of different codecs");
  }
  auto by_offset = [](const EncodedChunk& a, const EncodedChunk& b) { return a.offset < b.offset; };
  // Check the two sorted lists against each other before anything moves.
  size_t i = 0, j = 0;
  uint64_t end = 0;
  bool any = false;
  while (i < chunks.size() || j < other.chunks.size()) {
    const bool mine = j == other.chunks.size() ||
                      (i < chunks.size() && chunks[i].offset < other.chunks[j].offset);
    const EncodedChunk& c = mine ? chunks[i++] : other.chunks[j++];
    if (any && c.offset < end) {
      return absl::InvalidArgumentError(absl::StrCat("elements from ", c.offset,
                                                     " were already received"));
    }
    end = c.offset + c.count;
    any = true;
  }
  std::vector<EncodedChunk> merged;
  merged.reserve(chunks.size() + other.chunks.size());
  std::merge(std::make_move_iterator(chunks.begin()), std::make_move_iterator(chunks.end()),
             std::make_move_iterator(other.chunks.begin()),
             std::make_move_iterator(other.chunks.end()), std::back_inserter(merged), by_offset);
  chunks = std::move(merged);
  elements += other.elements;
  return absl::OkStatus();
}

absl::StatusOr<PayloadStats> Measure(const EncodedPayload& payload) {
  constexpr uint64_t kWindow = 1 << 14;
  std::vector<float> window(kWindow);
  PayloadStats stats;
  float max_abs = 0;
  for (const auto& [begin, end] : payload.Ranges()) {
    if (payload.codec.sparse()) {
      // Its zeros add nothing: the kept values alone, in time proportional to them.
      ATL_RETURN_IF_ERROR(payload.VisitKept(
          begin, end - begin, [&](uint64_t, const uint32_t*, const float* v, size_t m) {
            stats.sum_squares += compression::SumSquares(v, m);
            max_abs = std::max(max_abs, compression::MaxAbs(v, m));
          }));
      continue;
    }
    for (uint64_t a = begin; a < end; a += kWindow) {
      const uint64_t len = std::min(kWindow, end - a);
      ATL_RETURN_IF_ERROR(payload.Read(a, len, window.data()));
      stats.sum_squares += compression::SumSquares(window.data(), len);
      max_abs = std::max(max_abs, compression::MaxAbs(window.data(), len));
    }
  }
  stats.max_abs = max_abs;
  return stats;
}

ChunkStream::ChunkStream(PayloadId id, compression::CodecSpec codec, uint64_t fragment_elements,
                         size_t max_ranges)
    : id_(std::move(id)), fragment_elements_(fragment_elements), max_ranges_(max_ranges) {
  payload_.codec = codec;
}

absl::Status ChunkStream::Add(pb::Chunk&& chunk) {
  const auto& h = chunk.header();
  const uint32_t index = uint32_t(payload_.chunks.size());
  if (complete_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", h.chunk_index(), " arrived after the ",
                                                   "last chunk of the payload (", num_chunks_,
                                                   " chunks)"));
  }
  if (h.chunk_index() != index || (index > 0 && h.num_chunks() != num_chunks_) ||
      h.num_chunks() == 0 || h.num_chunks() <= h.chunk_index()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", h.chunk_index(), " of ", h.num_chunks(), " arrived where chunk ", index, " of ",
        index > 0 ? num_chunks_ : h.num_chunks(), " was expected (chunks travel in order)"));
  }
  ATL_RETURN_IF_ERROR(
      CheckChunk(id_, payload_.codec, fragment_elements_, 0, fragment_elements_, chunk));
  // Ascending and never overlapping: the chunk continues the previous one or starts a new range.
  bool new_range = index == 0;
  if (index > 0) {
    const EncodedChunk& prev = payload_.chunks.back();
    const uint64_t prev_end = prev.offset + prev.count;
    if (h.offset() < prev_end) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " starts at element ",
                                                     h.offset(), ", inside what the payload already holds (up to ",
                                                     prev_end, ")"));
    }
    new_range = h.offset() > prev_end;
    const uint64_t block = std::max<uint32_t>(1, payload_.codec.block_size);
    if (!new_range && prev.count % block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", index - 1, " carries ", prev.count, " elements and chunk ", index,
          " continues it: only the last chunk of a range may end inside a ", block,
          "-element scale block"));
    }
  }
  if (new_range && ranges_ == max_ranges_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", index, " starts range ",
                                                   ranges_ + 1, " of a payload that may hold ",
                                                   max_ranges_));
  }
  ranges_ += new_range ? 1 : 0;
  num_chunks_ = h.num_chunks();
  payload_.elements += h.num_elements();
  payload_.chunks.push_back({h.offset(), h.num_elements(), std::move(*chunk.mutable_data())});
  complete_ = h.chunk_index() + 1 == h.num_chunks();
  return absl::OkStatus();
}

absl::Status ChunkStream::CheckComplete() const {
  if (complete_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "payload of island ", Printable(id_.island_id), " for round ", id_.round, " is incomplete: ",
      payload_.chunks.size(), " of ", num_chunks_, " chunks received"));
}

Assembler::Assembler(PayloadId id, uint64_t fragment_elements, uint64_t begin, uint64_t n,
                     Encoding codec, Consumer consume)
    : id_(std::move(id)),
      codec_(codec),
      fragment_elements_(fragment_elements),
      begin_(begin),
      n_(n),
      consume_(std::move(consume)) {
  if (!consume_) values_.assign(n, 0.0f);
}

absl::Status Assembler::Add(const pb::Chunk& chunk) {
  ATL_RETURN_IF_ERROR(CheckChunk(id_, codec_, fragment_elements_, 0, fragment_elements_, chunk));
  const auto& h = chunk.header();
  const std::string where = absl::StrCat("chunk ", h.chunk_index(), " of round ", h.round(),
                                         ", fragment ", h.fragment());
  // The part of the chunk inside [begin, begin + n): a chunk of a service's update may straddle
  // the range a rank owns.
  const uint64_t first = std::max(h.offset(), begin_);
  const uint64_t last = std::min(h.offset() + h.num_elements(), begin_ + n_);
  if (first >= last) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": range [", h.offset(), ", +",
                                                   h.num_elements(), ") is outside [", begin_, ", ",
                                                   begin_ + n_, ")"));
  }
  const uint64_t count = last - first;
  // Overlap with an accepted chunk (a duplicate or a forged range).
  auto next = ranges_.lower_bound(first);
  if (next != ranges_.end() && next->first < first + count) {
    return absl::AlreadyExistsError(absl::StrCat(where, ": overlaps elements already received"));
  }
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > first) {
      return absl::AlreadyExistsError(absl::StrCat(where, ": overlaps elements already received"));
    }
  }
  // Decode into scratch first: a payload with non-finite values must not touch what was accepted.
  scratch_.resize(count);
  if (auto s = compression::DecodeSlice(
          *SpecOf(h), reinterpret_cast<const uint8_t*>(chunk.data().data()), chunk.data().size(),
          h.num_elements(), first - h.offset(), count, scratch_.data());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  if (consume_) {
    consume_(first, scratch_.data(), count);
  } else {
    std::copy(scratch_.begin(), scratch_.end(), values_.begin() + int64_t(first - begin_));
  }
  ranges_[first] = count;
  covered_ += count;
  return absl::OkStatus();
}

absl::Status Assembler::CheckComplete() const {
  if (complete()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("payload of island ", Printable(id_.island_id),
                                                 " for round ", id_.round, " is incomplete: ",
                                                 covered_, " of ", n_,
                                                 " elements received"));
}

double EncodingError::relative() const {
  return exact_squares > 0 ? std::sqrt(error_squares / exact_squares) : 0.0;
}

absl::Status SampleChunkError(const pb::Chunk& chunk, const float* exact, uint64_t max_elements,
                              EncodingError* error) {
  const auto& h = chunk.header();
  ATL_ASSIGN_OR_RETURN(auto spec, SpecOf(h));
  const uint64_t count = std::min<uint64_t>(max_elements, h.num_elements());
  std::vector<float> decoded(count);
  const auto* bytes = reinterpret_cast<const uint8_t*>(chunk.data().data());
  ATL_RETURN_IF_ERROR(compression::DecodeSlice(spec, bytes, chunk.data().size(), h.num_elements(),
                                               0, count, decoded.data()));
  for (uint64_t i = 0; i < count; ++i) {
    const double d = double(decoded[i]) - double(exact[i]);
    error->error_squares += d * d;
    error->exact_squares += double(exact[i]) * double(exact[i]);
  }
  error->elements += count;
  return absl::OkStatus();
}

absl::Status SampleEncodingError(const std::vector<pb::Chunk>& chunks, const float* exact,
                                 uint64_t exact_offset, uint64_t max_elements,
                                 EncodingError* error) {
  if (chunks.empty()) return absl::OkStatus();
  const uint64_t per_chunk = std::max<uint64_t>(1, max_elements / chunks.size());
  for (const auto& c : chunks) {
    ATL_RETURN_IF_ERROR(
        SampleChunkError(c, exact + (c.header().offset() - exact_offset), per_chunk, error));
  }
  return absl::OkStatus();
}

}  // namespace atl::outer
