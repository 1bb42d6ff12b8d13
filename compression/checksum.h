// Checksums for payloads and files: XXH64 with seed 0, the one hash on atoll's wire and on disk.
// And the hash of a copy of the global parameters (ParamsHash), which every copy is checked by.
#ifndef ATOLL_COMPRESSION_CHECKSUM_H_
#define ATOLL_COMPRESSION_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
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

// The hash of fp32 parameters: elements [first, first + n) of a fragment held in x[n]. The sum
// (mod 2^64) over the elements of a 64-bit mix of (element index, value bits), finalized with the
// count. A sum, so a change to a few elements updates it in time proportional to them
// (ParamsHashTerm before and after) and any split of a range hashes in parallel; the mix of the
// index makes it position-dependent (two values swapped change it), and a change to any element
// changes the hash but with probability 2^-64.
inline uint64_t ParamsHashTerm(uint64_t index, float value);
uint64_t ParamsHashSum(const float* x, uint64_t first, size_t n);  // the sum alone
uint64_t ParamsHashOf(uint64_t sum, uint64_t n);                   // the finalized hash
// What the sum changes by when elements index[i] go from before[i] to after[i], i < m.
uint64_t ParamsHashChange(const uint64_t* index, const float* before, const float* after,
                          size_t m);
inline uint64_t ParamsHash(const float* x, uint64_t first, size_t n) {
  return ParamsHashOf(ParamsHashSum(x, first, n), n);
}
// Whether n stored parameters match the hash stored with them: ParamsHash, or the XXH64 of their
// bytes that files written before ParamsHash carry.
inline bool StoredParamsMatch(const float* x, size_t n, uint64_t hash) {
  return ParamsHash(x, 0, n) == hash || Checksum(x, n * sizeof(float)) == hash;
}

namespace internal {

// MurmurHash3's 64-bit finalizer: a bijection that mixes every input bit into every output bit.
inline uint64_t Mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

inline uint64_t ParamsTerm(uint64_t index, uint32_t bits) {
  return Mix(((index << 32) | bits) ^ ((index >> 32) * 0x9E3779B97F4A7C15ULL));
}

}  // namespace internal

inline uint64_t ParamsHashTerm(uint64_t index, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return internal::ParamsTerm(index, bits);
}

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CHECKSUM_H_
