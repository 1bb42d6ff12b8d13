#include "outer/payload.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "compression/checksum.h"

namespace atl::outer {

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
  // Chunks hold whole scale blocks, so each chunk is encoded and checked on its own.
  const uint64_t unit = std::max<uint32_t>(1, spec.block_size);
  const size_t unit_bytes = std::max<size_t>(1, compression::EncodedBytes(spec, unit));
  const uint64_t per_chunk = std::max<uint64_t>(1, max_chunk_bytes / unit_bytes) * unit;
  const uint32_t num_chunks = uint32_t(std::max<uint64_t>(1, (n + per_chunk - 1) / per_chunk));
  std::vector<pb::Chunk> out;
  out.reserve(num_chunks);
  for (uint32_t c = 0; c < num_chunks; ++c) {
    const uint64_t first = uint64_t(c) * per_chunk;
    const uint64_t count = std::min<uint64_t>(per_chunk, n - first);
    pb::Chunk chunk;
    auto* h = chunk.mutable_header();
    h->set_run_id(id.run_id);
    h->set_island_id(id.island_id);
    h->set_round(id.round);
    h->set_fragment(id.fragment);
    h->set_codec(pb::Codec(int(spec.codec)));
    h->set_block_size(spec.block_size);
    h->set_offset(offset + first);
    h->set_num_elements(count);
    h->set_fragment_elements(fragment_elements);
    h->set_chunk_index(c);
    h->set_num_chunks(num_chunks);
    std::string* data = chunk.mutable_data();
    data->resize(compression::EncodedBytes(spec, count));
    rounding.first_index = offset + first;
    if (auto s = compression::Encode(spec, values + first, count,
                                     reinterpret_cast<uint8_t*>(data->data()), rounding);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("element ", offset + first, "+: ", s.message()));
    }
    chunk.set_xxh64(compression::Checksum(data->data(), data->size()));
    out.push_back(std::move(chunk));
  }
  return out;
}

Assembler::Assembler(PayloadId id, uint64_t fragment_elements, uint64_t begin, uint64_t n,
                     compression::CodecSpec codec)
    : id_(std::move(id)),
      codec_(codec),
      fragment_elements_(fragment_elements),
      begin_(begin),
      values_(n, 0.0f) {}

absl::Status Assembler::Add(const pb::Chunk& chunk) {
  const auto& h = chunk.header();
  const std::string where = absl::StrCat("chunk ", h.chunk_index(), " of island '", h.island_id(),
                                         "' for round ", h.round(), ", fragment ", h.fragment());
  if (h.run_id() != id_.run_id) {
    return absl::NotFoundError(absl::StrCat(where, ": unknown run '", h.run_id(), "'"));
  }
  if (h.island_id() != id_.island_id || h.round() != id_.round || h.fragment() != id_.fragment) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": does not belong to the payload of island '", id_.island_id,
                     "', round ", id_.round, ", fragment ", id_.fragment));
  }
  if (h.fragment_elements() != fragment_elements_) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": fragment has ", fragment_elements_,
                                                   " elements, chunk says ",
                                                   h.fragment_elements()));
  }
  auto spec = compression::MakeSpec(int(h.codec()), h.block_size());
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", spec.status().message()));
  if (spec->codec != codec_.codec || spec->block_size != codec_.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": codec ", compression::CodecName(spec->codec), "/", spec->block_size,
        " does not match the run's ", compression::CodecName(codec_.codec), "/",
        codec_.block_size));
  }
  const uint64_t first = h.offset(), count = h.num_elements();
  if (count == 0 || first < begin_ || first + count > begin_ + values_.size() ||
      first + count < first) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": range [", first, ", ", first + count,
                                                   ") is outside [", begin_, ", ",
                                                   begin_ + values_.size(), ")"));
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
  // Decode into scratch first: a payload with non-finite values must not touch values_.
  std::vector<float> scratch(count);
  if (auto s = compression::Decode(*spec, reinterpret_cast<const uint8_t*>(chunk.data().data()),
                                   chunk.data().size(), count, scratch.data());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  std::copy(scratch.begin(), scratch.end(), values_.begin() + int64_t(first - begin_));
  ranges_[first] = count;
  covered_ += count;
  return absl::OkStatus();
}

absl::Status Assembler::CheckComplete() const {
  if (complete()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("payload of island '", id_.island_id,
                                                 "' for round ", id_.round, " is incomplete: ",
                                                 covered_, " of ", values_.size(),
                                                 " elements received"));
}

}  // namespace atl::outer
