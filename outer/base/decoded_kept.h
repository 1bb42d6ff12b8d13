// A sparse payload's kept values, decoded once when the service checks a push, so that the fold
// of a sparse round reads them instead of decoding the payload a second time.
#ifndef ATOLL_OUTER_BASE_DECODED_KEPT_H_
#define ATOLL_OUTER_BASE_DECODED_KEPT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "outer/base/payload.h"

namespace atl::outer {

// A sparse chunk may also hold its kept values decoded (when the service checked it and its
// KeptBudget had room), so that folding it again reads them instead of decoding twice: per codec
// chunk (spec.block_size elements from the chunk's start), the offsets in it of the values kept,
// ascending, and the values, exactly what compression::VisitKept hands over. 8 bytes per value.
struct DecodedKept {
  std::vector<uint32_t> begin;  // codec chunk b's values: [begin[b], begin[b + 1])
  std::vector<uint32_t> index;  // offsets in their codec chunk
  std::vector<float> value;
  uint64_t capacity_bytes() const;
};

// The storage of decoded kept values, bounded: what is handed out plus what is kept for reuse
// stays within the budget's bytes. Dropped, a DecodedKept's storage is kept for the next one,
// since writing to fresh pages costs several times more than decoding into warm ones (and the
// service trims the heap after each commit).
class KeptBudget {
 public:
  explicit KeptBudget(uint64_t bytes);
  // Empty storage with room for `values` values in `blocks` codec chunks, or null when the
  // budget has no room for it.
  std::shared_ptr<DecodedKept> Take(uint64_t blocks, uint64_t values);
  uint64_t bytes() const;   // held: handed out or kept for reuse
  uint64_t in_use() const;  // handed out

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the storage handed out, which may outlive it
};

// Measures a sparse payload chunk by chunk, in order, as its chunks arrive (a push's check runs
// while the rest is still in transit), keeping each chunk's kept values decoded
// (EncodedChunk::kept) while `budget` (if any) has room for them: the sums Measure makes of the
// payload.
class ChunkMeter {
 public:
  explicit ChunkMeter(KeptBudget* budget) : budget_(budget) {}
  // The next chunk of the payload; INVALID_ARGUMENT names a value that is not finite. After a
  // failure the meter takes no more chunks and returns that failure.
  absl::Status Add(const compression::CodecSpec& codec, EncodedChunk* chunk);
  // The payload's stats so far, or the first failure.
  absl::StatusOr<PayloadStats> Result() const;

 private:
  KeptBudget* budget_;
  PayloadStats stats_;
  float max_abs_ = 0;
  absl::Status failed_;
};

// Measure, which also keeps each sparse chunk's kept values decoded (EncodedChunk::kept) while
// `budget` has room for them; then EncodedPayload::VisitKept reads them instead of decoding.
absl::StatusOr<PayloadStats> MeasureAndKeep(EncodedPayload* payload, KeptBudget* budget);

// compression::VisitKept over elements [within, within + take) of a chunk whose kept values are
// decoded (codec chunks of `block` elements): the same calls with the same values.
void ReplayKept(const DecodedKept& kept, uint64_t block, uint64_t within, uint64_t take,
                const EncodedPayload::KeptVisitor& visit);

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_DECODED_KEPT_H_
