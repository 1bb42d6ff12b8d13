// Every codec in one table: what the rest of atoll asks of a codec (its name, its block rule, its
// byte layout, its entry points, where it runs) is a row here, so that nothing outside
// compression/ switches on codecs. Adding a codec: its file in compression/ with its row (the
// encoder, the decoder and the layout), a line in kCodecs (codec_traits.cc), its Codec value
// (codec_spec.h, the same number as atoll.v1.Codec in proto/), and its tests.
//
// Layout rule shared by every codec: an encoded payload of n elements in blocks of b is
//   ceil(n / b) x block_bytes   (per-block data: scales)
//   then ceil(n x element_bits / 8) bytes of elements, element i at bit i x element_bits.
// A chunk that starts and ends on the block grid (and on whole bytes of elements) is a payload of
// its own: its block data, then its elements (SliceLayout).
#ifndef ATOLL_COMPRESSION_CODEC_TRAITS_H_
#define ATOLL_COMPRESSION_CODEC_TRAITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "compression/codec_spec.h"

namespace atl::compression {

struct CodecTraits {
  Codec id;
  const char* name;
  // Elements per block: 0 for codecs without blocks; else the default and the range allowed.
  uint32_t default_block;
  uint32_t min_block, max_block;
  uint32_t block_multiple;  // sub-byte elements: blocks are multiples of this, so each starts on a byte
  uint32_t block_bytes;   // per block, before the elements
  uint32_t element_bits;  // per element
  // Encodes in[0, n) into out[EncodedBytes]. Returns the largest magnitude seen as float bits
  // (>= 0x7F800000: some input was not finite) when `checks_finite` (the encoder looks at every
  // magnitude anyway); otherwise the caller checks the input first and the result is ignored.
  uint32_t (*encode)(uint32_t block, const float* in, size_t n, uint8_t* out,
                     const Rounding& rounding);
  bool checks_finite;
  // Decodes elements [first, last) of an n-element payload into out[0, last - first).
  void (*decode)(uint32_t block, const uint8_t* in, size_t n, size_t first, size_t last,
                 float* out);
  // For codecs whose block data can be malformed beyond decoding to non-finite values (a table
  // out of order): nullptr when the blocks holding elements [first, last) are well formed, else
  // what is wrong, the first bad block's index in *bad. nullptr: any block data is.
  const char* (*malformed_block)(uint32_t block, const uint8_t* in, size_t n, size_t first,
                                 size_t last, size_t* bad) = nullptr;
  bool stochastic_rounding;  // honours Rounding::stochastic (fp32 has nothing to round)
  bool simd;                 // a vectorized CPU path (AVX2, chosen at run time)
  bool cuda;                 // CUDA kernels (codec_cuda.cu), bit-identical to the CPU's; also
                             // those of the sparse codecs with these values (codec_cuda_sparse.cu)
};

// The codecs this build implements, in Codec order.
const CodecTraits* const* Codecs(size_t* count);
// nullptr for a number or name this build does not implement.
const CodecTraits* FindCodec(Codec codec);
const CodecTraits* FindCodec(const std::string& name);

// Byte ranges of a payload of n elements that hold its elements [first, last), which must lie on
// the block grid (last may be n): the blocks' data, then the elements'.
struct SliceLayout {
  size_t blocks_offset = 0, blocks_bytes = 0;
  size_t elements_offset = 0, elements_bytes = 0;
};
SliceLayout SliceOf(const CodecSpec& spec, size_t n, size_t first, size_t last);

// OK, or INVALID_ARGUMENT naming the first block among those holding elements [first, last) of an
// n-element payload in blocks of `block` that t.malformed_block finds malformed.
absl::Status CheckBlocks(const CodecTraits& t, uint32_t block, const uint8_t* in, size_t n,
                         size_t first, size_t last);

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CODEC_TRAITS_H_
