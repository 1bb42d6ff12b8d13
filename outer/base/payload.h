// Payloads on the wire: a span of fp32 values of one fragment, encoded with a codec and cut into
// checksummed chunks; and the reverse, verifying every chunk before a single value is accepted.
#ifndef ATOLL_OUTER_BASE_PAYLOAD_H_
#define ATOLL_OUTER_BASE_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "atoll/v1/outer.pb.h"
#include "compression/codec.h"

namespace atl::outer {

namespace pb = ::atollpb::v1;

inline constexpr size_t kDefaultChunkBytes = size_t(1) << 20;  // 1 MiB, far below gRPC's limits

// What a payload belongs to.
struct PayloadId {
  std::string run_id;
  std::string island_id;
  uint64_t round = 0;
  uint32_t fragment = 0;
};

// Inner-optimizer moments on the wire (outer.moment_sync_every; the moment layout of outer.proto):
// two channels of a fragment's N elements, channel-major, in bf16 both ways.
inline constexpr uint32_t kMomentChannels = 2;
inline constexpr compression::CodecSpec kMomentCodec = {compression::Codec::kBf16, 0, 0};

// The encodings a payload's chunks may carry. Pseudo-gradients and dense runs' updates: exactly
// `spec`. The outer updates of a sparse run (UpdateEncoding): for each chunk the service picks the
// smaller of the union of the contributions' indices (the run's chunks, any number of values
// kept, the values in FP4 E2M1: zero is one of its values) and dense FP4 E2M1 in blocks of 32.
struct Encoding {
  compression::CodecSpec spec;
  bool update = false;  // of a sparse run: the two families above
  Encoding(compression::CodecSpec s = {}) : spec(s) {}  // NOLINT: exactly `s`
  bool Accepts(const compression::CodecSpec& got) const;
  std::string Text() const;
  // What chunk plans are made with: the largest encoding per element of those accepted.
  compression::CodecSpec PlanSpec() const;
  // The encoding of n values u[0, n) (a chunk of an update) the service sends.
  compression::CodecSpec Choose(const float* u, size_t n) const;
  // The same for n values that are zero but at idx[m] (ascending) with u[m].
  compression::CodecSpec ChooseSparse(const uint32_t* idx, const float* u, size_t m,
                                      size_t n) const;
};
Encoding UpdateEncoding(const compression::CodecSpec& contributions);
// The most bytes the outer update of n elements takes when `contributors` sent `contributions`
// (sparse: the union of their indices, or dense FP4 if smaller; dense: the same codec).
size_t UpdateBytesAtMost(const compression::CodecSpec& contributions, uint32_t contributors,
                         uint64_t n);

// A chunk header's codec, block size and topk as a spec (INVALID_ARGUMENT naming the problem).
absl::StatusOr<compression::CodecSpec> SpecOf(const pb::ChunkHeader& header);

// How a payload of n elements is cut into chunks: whole scale blocks, at most max_chunk_bytes
// encoded bytes (or one block) each; chunk c holds elements [c * per_chunk, ...) of the payload.
struct ChunkPlan {
  uint64_t per_chunk = 0;
  uint32_t num_chunks = 0;
};
ChunkPlan PlanChunks(const compression::CodecSpec& spec, uint64_t n,
                     size_t max_chunk_bytes = kDefaultChunkBytes);

// One chunk: values[0, count) as elements [offset, offset + count) of the fragment, numbered
// `index` of `num_chunks` (a payload encoded chunk by chunk never exists whole). With `storage`,
// the chunk's data takes that buffer (SpareChunkData::For, outer/base/reused_buffers.h).
absl::StatusOr<pb::Chunk> EncodeChunk(const PayloadId& id, const compression::CodecSpec& spec,
                                      const float* values, uint64_t offset, uint64_t count,
                                      uint64_t fragment_elements, uint32_t index,
                                      uint32_t num_chunks, compression::Rounding rounding = {},
                                      std::string* storage = nullptr);

// The same, with the encoding done by `encode`: it writes EncodedBytes(spec, count) bytes to out,
// with the rounding given (first_index set to `offset`); a device copy encodes on its device.
using ChunkEncoder =
    std::function<absl::Status(uint8_t* out, const compression::Rounding& rounding)>;
absl::StatusOr<pb::Chunk> EncodeChunkWith(const PayloadId& id, const compression::CodecSpec& spec,
                                          uint64_t offset, uint64_t count,
                                          uint64_t fragment_elements, uint32_t index,
                                          uint32_t num_chunks, compression::Rounding rounding,
                                          const ChunkEncoder& encode,
                                          std::string* storage = nullptr);

// Encodes values[0, n) as elements [offset, offset + n) of a fragment of `fragment_elements`.
// With stochastic rounding, element k of the fragment draws from (rounding.seed, k), so the bytes
// do not depend on how the payload is cut into chunks.
absl::StatusOr<std::vector<pb::Chunk>> EncodeChunks(const PayloadId& id,
                                                    const compression::CodecSpec& spec,
                                                    const float* values, uint64_t offset,
                                                    uint64_t n, uint64_t fragment_elements,
                                                    size_t max_chunk_bytes = kDefaultChunkBytes,
                                                    compression::Rounding rounding = {});

// How far an encoding is from the values it encodes, measured on a sample: the first elements of
// each chunk, at most `max_elements` decoded in all (a few microseconds for any payload).
struct EncodingError {
  double error_squares = 0;  // sum of (decoded - exact)^2 over the sample
  double exact_squares = 0;  // sum of exact^2
  uint64_t elements = 0;
  // Relative RMS error ||decoded - exact|| / ||exact|| (0 for an all-zero sample).
  double relative() const;
  void Add(const EncodingError& other) {
    error_squares += other.error_squares;
    exact_squares += other.exact_squares;
    elements += other.elements;
  }
};
// `exact[i]` is element `exact_offset + i` of the fragment; every chunk lies inside `exact`.
absl::Status SampleEncodingError(const std::vector<pb::Chunk>& chunks, const float* exact,
                                 uint64_t exact_offset, uint64_t max_elements, EncodingError* error);
// The same for one chunk: its first `max_elements` elements; `exact` holds the chunk's elements.
absl::Status SampleChunkError(const pb::Chunk& chunk, const float* exact, uint64_t max_elements,
                              EncodingError* error);

// The range a request names: elements [offset, offset + count) of fragment `fragment` of `total`
// elements (count 0: to its end), checked with overflow-safe arithmetic. OUT_OF_RANGE naming the
// range otherwise: every RPC that names a range (AwaitUpdate, FetchState) refuses alike.
absl::Status CheckRange(uint64_t offset, uint64_t count, uint64_t total, uint32_t fragment);

// The checks a chunk passes before its bytes are kept or decoded: it belongs to the payload (run,
// island, round, fragment), uses the payload's codec, carries elements inside [begin, end) of a
// fragment of `fragment_elements`, exactly the bytes those elements take, and a matching checksum.
// NOT_FOUND for another run, DATA_LOSS for a checksum, INVALID_ARGUMENT otherwise. Strings from
// the header appear in messages only through Printable().
absl::Status CheckChunk(const PayloadId& id, const Encoding& codec, uint64_t fragment_elements,
                        uint64_t begin, uint64_t end, const pb::Chunk& chunk);

// The part of an encoded chunk that holds elements [first, last) of the fragment: whole scale
// blocks (sparse: chunks) of the chunk's own grid (so it may start a little before `first` and end
// a little after `last`), with its own header and checksum. Exact: no value is re-encoded. The
// chunk must be well formed (as CheckChunk accepts it) and overlap [first, last).
pb::Chunk SliceChunk(const pb::Chunk& chunk, uint64_t first, uint64_t last);

struct DecodedKept;  // outer/base/decoded_kept.h

// A verified payload kept as it arrived (encoded): chunks of a fragment, in order of their
// offsets, not overlapping, possibly with gaps (one rank's ranges, or several ranks' merged).
// Decoded on demand, window by window.
struct EncodedChunk {
  uint64_t offset = 0;  // first element, within the fragment
  uint64_t count = 0;
  std::string data;
  std::shared_ptr<const DecodedKept> kept;  // sparse codecs: decoded once (MeasureAndKeep)
};

struct EncodedPayload {
  compression::CodecSpec codec;
  std::vector<EncodedChunk> chunks;
  uint64_t elements = 0;  // covered by the chunks

  size_t bytes() const;
  // Whether the chunks cover [0, n) without a gap.
  bool Covers(uint64_t n) const;
  // The element ranges [begin, end) the chunks cover, adjacent chunks joined.
  std::vector<std::pair<uint64_t, uint64_t>> Ranges() const;
  // Decodes elements [first, first + count) (fragment offsets); DATA_LOSS if a gap is crossed.
  absl::Status Read(uint64_t first, uint64_t count, float* out) const;
  // A sparse payload's kept elements in [first, first + count), a codec chunk at a time
  // (compression::VisitKept, or the chunks' decoded values where kept; `base` a fragment offset);
  // time in the values kept. DATA_LOSS as Read.
  using KeptVisitor = std::function<void(uint64_t base, const uint32_t* index, const float* value,
                                         size_t m)>;
  absl::Status VisitKept(uint64_t first, uint64_t count, const KeptVisitor& visit) const;
  // Drops the chunks' decoded kept values (returning their budget); reads decode again.
  void DropKept();
  // Adds the chunks of `other` (same codec); INVALID_ARGUMENT if they overlap chunks held (and
  // then nothing changes).
  absl::Status Merge(EncodedPayload&& other);
};

// Decodes a payload window by window: every value must be finite (INVALID_ARGUMENT naming the first
// one that is not); returns its sum of squares and largest magnitude.
struct PayloadStats {
  double sum_squares = 0;
  double max_abs = 0;
};
absl::StatusOr<PayloadStats> Measure(const EncodedPayload& payload);

// Receives the chunks of one stream (a Push call) and checks each as it arrives, before keeping its
// bytes: CheckChunk, in order (chunk_index 0, 1, ... with one num_chunks throughout), ascending
// and never overlapping (a chunk continues the previous one or starts a new range after it, at
// most `max_ranges` ranges), whole scale blocks in a chunk that the next one continues. A whole
// fragment's payload is one range; a rank of a sharded island pushes the ranges it owns. The bytes
// kept are bounded by the encoded size of the fragment plus a scale block per range.
class ChunkStream {
 public:
  ChunkStream(PayloadId id, compression::CodecSpec codec, uint64_t fragment_elements,
              size_t max_ranges = 1);

  // Takes the chunk's data. A refused chunk leaves the stream as it was.
  absl::Status Add(pb::Chunk&& chunk);
  bool complete() const { return complete_; }
  // Names what is missing when not complete.
  absl::Status CheckComplete() const;
  // The payload received (complete or not).
  EncodedPayload Take() && { return std::move(payload_); }
  const EncodedPayload& payload() const { return payload_; }
  EncodedChunk* newest() { return payload_.chunks.empty() ? nullptr : &payload_.chunks.back(); }
  const PayloadId& id() const { return id_; }

 private:
  PayloadId id_;
  uint64_t fragment_elements_;
  size_t max_ranges_;
  EncodedPayload payload_;
  size_t ranges_ = 0;
  uint32_t num_chunks_ = 0;  // from the first chunk
  bool complete_ = false;
};

// Collects the chunks of one payload covering elements [begin, begin + n) of a fragment, in any
// order; of a chunk that straddles the range, the part inside is kept. Every chunk is checked
// (CheckChunk, overlap, finite values) before its values are accepted; a refused chunk leaves the
// assembler as it was.
class Assembler {
 public:
  // Receives the accepted values of each chunk as it is added: elements [first, first + count) of
  // the fragment. An assembler given a consumer keeps no values of its own.
  using Consumer = std::function<void(uint64_t first, const float* values, uint64_t count)>;

  // Chunks must use an encoding `codec` accepts (the run's for the payload's direction).
  Assembler(PayloadId id, uint64_t fragment_elements, uint64_t begin, uint64_t n,
            Encoding codec = compression::CodecSpec{compression::Codec::kFp32, 0},
            Consumer consume = nullptr);

  absl::Status Add(const pb::Chunk& chunk);
  bool complete() const { return covered_ == n_; }
  // Names what is missing when not complete.
  absl::Status CheckComplete() const;
  // The values received (without a consumer).
  const std::vector<float>& values() const { return values_; }
  std::vector<float>& mutable_values() { return values_; }

 private:
  PayloadId id_;
  Encoding codec_;
  uint64_t fragment_elements_, begin_, n_;
  Consumer consume_;
  std::vector<float> values_;
  std::vector<float> scratch_;
  std::map<uint64_t, uint64_t> ranges_;  // accepted chunk ranges: offset -> count
  uint64_t covered_ = 0;
};

// The header of a chunk of `id` holding elements [offset, offset + count) in `spec`.
pb::ChunkHeader HeaderOf(const PayloadId& id, const compression::CodecSpec& spec, uint64_t offset,
                         uint64_t count, uint64_t fragment_elements, uint32_t index,
                         uint32_t num_chunks);
// A kept chunk (EncodedChunk) on the wire again: its bytes under a header of `id`, checksummed.
pb::Chunk ChunkOf(const PayloadId& id, const compression::CodecSpec& spec, const EncodedChunk& c,
                  uint64_t fragment_elements, uint32_t index, uint32_t num_chunks);

// Sum of the serialized sizes of messages (bytes on the wire, before gRPC framing).
template <typename Message>
size_t WireBytes(const std::vector<Message>& messages) {
  size_t n = 0;
  for (const auto& m : messages) n += m.ByteSizeLong();
  return n;
}

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_PAYLOAD_H_
