// Buffers a service reuses from round to round instead of faulting in fresh pages: an update's
// chunks encoded into a retired update's buffers (or ones written ahead of the commit), and a
// push's messages parsed into committed contributions' buffers. Where page faults are slow (this
// development VM: 15-20 us per 4 KiB page) writing fresh pages costs more than the work done in
// them.
#ifndef ATOLL_OUTER_BASE_REUSED_BUFFERS_H_
#define ATOLL_OUTER_BASE_REUSED_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "atoll/v1/outer.pb.h"
#include "outer/base/payload.h"

namespace atl::outer {

// The data buffers of chunks nobody reads any more, for new chunks to be encoded into. Their pages
// are mapped already: faulting in fresh ones can cost more than the encoding (a 494M-parameter
// FP4 update took 2.2-2.4 s to make in 247 MB of fresh pages on this VM, 1.2-1.4 s in these).
struct SpareChunkData {
  std::vector<std::string> buffers;
  uint64_t bytes = 0;
  // Takes the chunks' data (leaving them without it) while the spare holds under max_bytes.
  void Keep(std::vector<pb::Chunk>& chunks, uint64_t max_bytes);
  // Takes `buffer` if the spare then holds at most max_bytes; whether it did.
  bool Add(std::string& buffer, uint64_t max_bytes);
  // A buffer for chunk c of a new payload (its contents are overwritten), or null.
  std::string* For(size_t c) { return c < buffers.size() ? &buffers[c] : nullptr; }
};

// Buffers of these sizes with every page written once, for a SpareChunkData: made while the
// service waits, so that a commit encodes into memory already mapped (a 47 MB update's pages cost
// about 0.2 s here).
std::vector<std::string> WrittenBuffers(const std::vector<size_t>& sizes);

// Byte buffers of payloads that are done with, lent to arriving chunks: a push parses each
// message into memory already mapped. Holds at most max_bytes of capacity; thread-safe.
class BufferPool {
 public:
  explicit BufferPool(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // Puts a kept buffer (emptied, its capacity kept) into *data if *data has no capacity of its own.
  void Lend(std::string* data);
  // Keeps the chunks' data while within the bound (the chunks are left without it).
  void Recycle(std::vector<EncodedChunk>& chunks);
  uint64_t bytes() const;

 private:
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  SpareChunkData spare_;  // under mu_
};

}  // namespace atl::outer

#endif  // ATOLL_OUTER_BASE_REUSED_BUFFERS_H_
