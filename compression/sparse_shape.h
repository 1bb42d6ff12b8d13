// The shape of one chunk of a sparse payload (compression/codec_sparse.h has the layout), shared by
// the CPU codec (codec_sparse.cc) and the CUDA kernels (codec_cuda_sparse.cu): both compute sizes
// and bit positions with this one function. No dependency beyond codec_math.h's ATOLL_HD.
#ifndef ATOLL_COMPRESSION_SPARSE_SHAPE_H_
#define ATOLL_COMPRESSION_SPARSE_SHAPE_H_

#include <cstddef>
#include <cstdint>

#include "compression/codec_math.h"

namespace atl::compression::sparse {

// Chunks may be at most this long (the value codecs' largest block) and topk at most the chunk.
inline constexpr uint32_t kMaxChunk = 4096;

// How the value codec lays out one block of the kept values (its row of codec_traits.h).
struct ValueLayout {
  bool blocked = false;       // the codec has a per-block header (a scale); the values are one block
  uint32_t block_bytes = 0;   // that header's bytes
  uint32_t element_bits = 0;  // per value
};

// What one chunk of `len` elements holds.
struct Shape {
  uint32_t k = 0;           // values kept
  uint32_t l = 0;           // Elias-Fano low bits per index
  size_t value_bytes = 0;   // the values' payload
  size_t upper_bits = 0;    // the high parts, unary
  size_t index_bytes = 0;   // low bits and high parts, padded to a byte
};

ATOLL_HD Shape ShapeOf(uint32_t topk, size_t len, const ValueLayout& v) {
  Shape s;
  s.k = uint32_t(topk < len ? topk : len);
  while ((uint64_t(s.k) << (s.l + 1)) <= len) ++s.l;  // floor(log2(len / k))
  s.value_bytes = (v.blocked ? v.block_bytes : 0) + (size_t(s.k) * v.element_bits + 7) / 8;
  s.upper_bits = s.k + ((len - 1) >> s.l) + 1;
  s.index_bytes = (size_t(s.k) * s.l + s.upper_bits + 7) / 8;
  return s;
}

}  // namespace atl::compression::sparse

#endif  // ATOLL_COMPRESSION_SPARSE_SHAPE_H_
