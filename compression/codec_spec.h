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
};

struct CodecSpec {
  Codec codec = Codec::kFp32;
  uint32_t block_size = 0;  // elements per scale block; 0 for codecs without scales
};

// How values are rounded to codes; decoding does not need to know.
struct Rounding {
  bool stochastic = false;  // false: nearest, ties to even
  uint64_t seed = 0;
  uint64_t first_index = 0;  // index of in[0] within the whole tensor (chunked encoding)
};

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CODEC_SPEC_H_
