#include "compression/checksum.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace atl::compression {

struct Hasher::State {
  XXH64_state_t xxh;
};

uint64_t Checksum(const void* data, size_t size) { return XXH64(data, size, 0); }

Hasher::Hasher() : state_(new State) { XXH64_reset(&state_->xxh, 0); }
Hasher::~Hasher() = default;

void Hasher::Update(const void* data, size_t size) { XXH64_update(&state_->xxh, data, size); }

uint64_t Hasher::Digest() const { return XXH64_digest(&state_->xxh); }

}  // namespace atl::compression
