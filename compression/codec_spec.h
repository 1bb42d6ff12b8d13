// The codec vocabulary without any dependency, so that CUDA sources can share it with the rest.
#ifndef ATOLL_COMPRESSION_CODEC_SPEC_H_
#define ATOLL_COMPRESSION_CODEC_SPEC_H_

#include <cstdint>

namespace atl::compression {

enum class Codec : int {
  kFp32 = 1,
  kBf16 = 2,
  kInt8 = 3,
  kFp4E2M1 = 4,
  kFp4E3M0 = 5,
  kFp8E4M3 = 6,
  kInt2 = 7,
  kInt2Centroid = 8,
};

// Dense (topk 0): every element encoded with `codec`, a scale per block of `block_size`.
// Sparse (topk > 0, compression/codec_sparse.h): each chunk of `block_size` elements keeps its
// `topk` largest magnitudes, their values encoded with `codec` as one block (one scale per chunk).
struct CodecSpec {
  Codec codec = Codec::kFp32;
  uint32_t block_size = 0;  // elements per scale block (sparse: per chunk); 0 for codecs without
  uint32_t topk = 0;        // values kept per chunk; 0: dense
  bool sparse() const { return topk > 0; }
  bool operator==(const CodecSpec& o) const {
    return codec == o.codec && block_size == o.block_size && topk == o.topk;
  }
  bool operator!=(const CodecSpec& o) const { return !(*this == o); }
};

// How values are rounded to codes; decoding does not need to know.
struct Rounding {
  bool stochastic = false;  // false: nearest, ties to even
  uint64_t seed = 0;
  uint64_t first_index = 0;  // index of in[0] within the whole tensor (chunked encoding)
};

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CODEC_SPEC_H_
