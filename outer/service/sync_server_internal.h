// Helpers shared by the files of SyncServer (not part of its interface).
#ifndef ATOLL_OUTER_SERVICE_SYNC_SERVER_INTERNAL_H_
#define ATOLL_OUTER_SERVICE_SYNC_SERVER_INTERNAL_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "compression/checksum.h"

namespace atl::outer::internal {

// Sync rounds kept for islands that fetch late: at most kCommittedKept, and beyond the newest
// kMinCommittedKept only while their encoded updates take at most an eighth of the fragment's fp32
// size or kCommittedKeptBytes, whichever is more (a small fragment keeps every round; a big one
// the newest only, which its peak memory counts: round r + 1 commits once every member pushed it,
// and a member pushes r + 1 only after it has applied r; one left behind by a deadline fetches the
// state instead, and a stream under way keeps its round alive until it ends).
inline constexpr size_t kCommittedKept = 8;
inline constexpr size_t kMinCommittedKept = 1;
inline constexpr uint64_t kCommittedKeptBytes = uint64_t(64) << 20;

// A tensor of the durable state, as written: XXH64 of its bytes (a file's integrity, not the
// parameters' hash that copies are compared by: compression::ParamsHash).
inline uint64_t TensorChecksum(const std::vector<float>& p) {
  return compression::Checksum(p.data(), p.size() * sizeof(float));
}

}  // namespace atl::outer::internal

#endif  // ATOLL_OUTER_SERVICE_SYNC_SERVER_INTERNAL_H_
