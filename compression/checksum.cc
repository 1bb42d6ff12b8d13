#include "compression/checksum.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstring>

#include "compression/clones.h"

namespace atl::compression {

struct Hasher::State {
  XXH64_state_t xxh;
};

uint64_t Checksum(const void* data, size_t size) { return XXH64(data, size, 0); }

Hasher::Hasher() : state_(new State) { XXH64_reset(&state_->xxh, 0); }
Hasher::~Hasher() = default;

void Hasher::Update(const void* data, size_t size) { XXH64_update(&state_->xxh, data, size); }

uint64_t Hasher::Digest() const { return XXH64_digest(&state_->xxh); }

ATOLL_CLONES uint64_t ParamsHashSum(const float* x, uint64_t first, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    sum += internal::ParamsTerm(first + i, bits);
  }
  return sum;
}

ATOLL_CLONES uint64_t ParamsHashChange(const uint64_t* index, const float* before,
                                       const float* after, size_t m) {
  uint64_t sum = 0;
  for (size_t i = 0; i < m; ++i) {
    uint32_t a, b;
    std::memcpy(&a, after + i, sizeof(a));
    std::memcpy(&b, before + i, sizeof(b));
    sum += internal::ParamsTerm(index[i], a) - internal::ParamsTerm(index[i], b);
  }
  return sum;
}

uint64_t ParamsHashOf(uint64_t sum, uint64_t n) {
  return internal::Mix(sum ^ internal::Mix(n + 0x2545F4914F6CDD1DULL));
}

}  // namespace atl::compression
