// Payloads on the wire: a span of fp32 values of one fragment, encoded with a codec and cut into
// checksummed chunks; and the reverse, verifying every chunk before a single value is accepted.
#ifndef ATOLL_OUTER_PAYLOAD_H_
#define ATOLL_OUTER_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
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

// Encodes values[0, n) as elements [offset, offset + n) of a fragment of `fragment_elements`.
// With stochastic rounding, element k of the fragment draws from (rounding.seed, k), so the bytes
// do not depend on how the payload is cut into chunks.
absl::StatusOr<std::vector<pb::Chunk>> EncodeChunks(const PayloadId& id,
                                                    const compression::CodecSpec& spec,
                                                    const float* values, uint64_t offset,
                                                    uint64_t n, uint64_t fragment_elements,
                                                    size_t max_chunk_bytes = kDefaultChunkBytes,
                                                    compression::Rounding rounding = {});

// Collects the chunks of one payload covering elements [begin, begin + n) of a fragment. Every
// chunk is checked (ids, codec, range, size, checksum, overlap, finite values) before its values
// are accepted; a refused chunk leaves the assembler as it was.
class Assembler {
 public:
  // Chunks must use `codec` (the run's codec for the payload's direction).
  Assembler(PayloadId id, uint64_t fragment_elements, uint64_t begin, uint64_t n,
            compression::CodecSpec codec = {compression::Codec::kFp32, 0});

  absl::Status Add(const pb::Chunk& chunk);
  bool complete() const { return covered_ == values_.size(); }
  // Names what is missing when not complete.
  absl::Status CheckComplete() const;
  const std::vector<float>& values() const { return values_; }
  std::vector<float>& mutable_values() { return values_; }

 private:
  PayloadId id_;
  compression::CodecSpec codec_;
  uint64_t fragment_elements_, begin_;
  std::vector<float> values_;
  std::map<uint64_t, uint64_t> ranges_;  // accepted chunk ranges: offset -> count
  uint64_t covered_ = 0;
};

// Sum of the serialized sizes of messages (bytes on the wire, before gRPC framing).
template <typename Message>
size_t WireBytes(const std::vector<Message>& messages) {
  size_t n = 0;
  for (const auto& m : messages) n += m.ByteSizeLong();
  return n;
}

}  // namespace atl::outer

#endif  // ATOLL_OUTER_PAYLOAD_H_
