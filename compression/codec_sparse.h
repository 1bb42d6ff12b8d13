// Sparse codecs (CodecSpec::topk > 0): chunk-wise top-k with the kept values in any codec of the
// traits table (SparseLoCo's TopK_chunk then Q; arXiv 2508.15706). Internal to compression/:
// codec.cc and codec_traits.cc route sparse specs here; the CUDA kernels (codec_cuda_sparse.cu)
// write the same bytes.
//
// Layout of a payload of n elements, chunks of C = block_size (the last may be shorter, L
// elements), k = topk kept per chunk (min(k, L) in a shorter one), chunk after chunk:
//   the values: the kept elements in index order, encoded with `codec` as one block of their own
//     (int2: a float32 step then 2-bit codes; fp4: a scale byte then 4-bit codes; fp32: as is);
//   the indices, ascending, Elias-Fano coded in one bit string (LSB first), padded to a byte:
//     l = floor(log2(L / k)) low bits of each index (k x l bits), then the high parts
//     h_i = index_i >> l in unary: bit h_i + i set, in k + ((L - 1) >> l) + 1 bits.
// So a chunk's size depends only on (codec, L, k): every chunk of a payload but the last has the
// same size, and a payload cut on the chunk grid is a payload of its own. At C = 4096 and k = 41
// (1%) the indices take 8.6 bits each (12 as plain 12-bit numbers).
// Selection: the k largest magnitudes, ties to the lower index, exact whatever the data: a floor
// guessed from a strided sample of 256 (the exact one of a histogram of the magnitudes' top bits
// when fewer than k pass the guess), one vector pass gathering the indices at or above it, a
// select on their (magnitude bits, ~index) keys, one pass in index order. Decoding refuses, naming the chunk: an index list that ends
// early or has more entries than kept, an index past the chunk, a repeated or unordered index.
#ifndef ATOLL_COMPRESSION_CODEC_SPARSE_H_
#define ATOLL_COMPRESSION_CODEC_SPARSE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "compression/codec_traits.h"
#include "compression/sparse_shape.h"

namespace atl::compression::sparse {

// Bytes of one chunk of `len` elements.
size_t ChunkBytes(const CodecSpec& spec, size_t len);
size_t EncodedBytes(const CodecSpec& spec, size_t n);
// Encodes in[0, n) into out[EncodedBytes]; returns the largest magnitude seen as float bits
// (>= 0x7F800000: some input was not finite, and out holds no valid payload).
uint32_t Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                const Rounding& rounding);
// Decodes elements [first, last) of an n-element payload of EncodedBytes(spec, n) bytes.
absl::Status DecodeSlice(const CodecSpec& spec, const uint8_t* in, size_t n, size_t first,
                         size_t last, float* out);
// The kept elements in [first, last) of an n-element payload, a chunk at a time (codec.h's
// VisitKept, whose visitor this is), with the checks of DecodeSlice, finite values included.
using KeptVisitor =
    std::function<void(size_t base, const uint32_t* index, const float* value, size_t m)>;
absl::Status VisitKept(const CodecSpec& spec, const uint8_t* in, size_t n, size_t first,
                       size_t last, const KeptVisitor& visit);
// Encode's bytes for n elements that are zero but at index[m] (ascending) with values value[m]:
// per chunk, time in the values it holds and its kept count. Returns as Encode.
// `decoded`, when given, is handed each chunk's kept elements as decoding reads them.
uint32_t EncodeNonzeros(const CodecSpec& spec, size_t n, const uint32_t* index, const float* value,
                        size_t m, uint8_t* out, const Rounding& rounding,
                        const KeptVisitor* decoded);
// The bytes of elements [first, last) on the chunk grid: whole chunks (as blocks, no elements).
SliceLayout SliceOf(const CodecSpec& spec, size_t n, size_t first, size_t last);

// The value codec's layout, for ShapeOf (compression/sparse_shape.h).
ValueLayout ValueLayoutOf(const CodecTraits& t);

// The k = min(topk, len) indices top-k keeps of x[0, len), ascending, into idx[k]; returns the
// largest magnitude's bits (as Encode). Exposed for tests and benchmarks.
uint32_t SelectTopK(const float* x, uint32_t len, uint32_t k, uint32_t* idx);

}  // namespace atl::compression::sparse

#endif  // ATOLL_COMPRESSION_CODEC_SPARSE_H_
