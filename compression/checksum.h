// Checksums for payloads and files: XXH64 with seed 0, the one hash on atoll's wire and on disk.
#ifndef ATOLL_COMPRESSION_CHECKSUM_H_
#define ATOLL_COMPRESSION_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <memory>

namespace atl::compression {

uint64_t Checksum(const void* data, size_t size);

// Incremental form, for data that arrives or is written in pieces. Same result as Checksum() of
// the concatenation.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CHECKSUM_H_
