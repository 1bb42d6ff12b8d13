// Payload codecs: pure functions from fp32 spans to bytes and back. No torch, no gRPC, no I/O.
// The numeric values of Codec match atoll.v1.Codec on the wire.
//
// Encoded layouts (n elements, blocks of `block_size`, the last block may be shorter):
//   fp32      n x float32, little-endian
//   bf16      n x bfloat16 (the top 16 bits of float32, rounded to nearest even)
//   int8      nblocks x float32 scale, then n x int8; scale = amax / 127, q = rne(x / scale),
//             x' = q * scale (a zero block has scale 0)
//   fp4_e2m1  nblocks x E8M0 scale byte (2^(byte - 127)), then ceil(n / 2) bytes of 4-bit codes
//             (element i in byte i / 2, low nibble first). MXFP4: scale = 2^(floor(log2 amax) - 2),
//             magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} x scale, values past 6 x scale saturate.
//   fp4_e3m0  same layout; sign + 3 exponent bits, no mantissa: magnitudes {0} and
//             {2^-5, 2^-4, 2^-3, 2^-2, 2^-1, 1, 2} x scale with scale = 2^floor(log2 amax), so the
//             block's largest magnitude lands in [1, 2).
//   fp8_e4m3  nblocks x E8M0 scale byte, then n bytes of E4M3 codes (MXFP8: scale =
//             2^(floor(log2 amax) - 8), magnitudes up to 448 x scale; compression/codec_fp8.cc).
//   int2      nblocks x float32 step q = amax / 3, then 2-bit codes (4 per byte, element i at bit
//             2 (i mod 4) of byte i / 4) decoding to -3q, -q, q, 3q (compression/codec_int2.cc).
//   sparse    (CodecSpec::topk > 0) chunk-wise top-k, values in any of the above, indices
//             Elias-Fano coded: compression/codec_sparse.h.
// Each codec is a row of the traits table (codec_traits.h), in a file of its own.
// 4-bit codes: bit 3 is the sign, bits 0-2 index the magnitudes; a value that rounds to zero is
// encoded as +0. Rounding is to nearest, ties to the even code, deterministic; the scale byte is
// clamped to [0, 254] (E8M0 has no infinity and 255 is NaN), so blocks beyond that range saturate.
// Encoding saturates, it never refuses a finite value: every payload an encoder writes decodes to
// finite values. Finite inputs whose nearest code would overflow float on decoding take the largest
// finite code of their sign instead: bf16 above 3.3895314e38 decodes to +-3.3895314e38, FP4 E3M0
// blocks with amax >= 2^127 cap at magnitude 2^127, and int8 takes its scale one ulp lower when
// 127 x scale would overflow (amax within an ulp of FLT_MAX).
// Stochastic rounding (optional, Rounding below) rounds a value between two neighbouring codes up
// with probability equal to its distance from the lower one over their gap, so it is unbiased;
// element k of a tensor draws Uniform(seed, k) from a counter-based generator (codec_math.h), so
// the result does not depend on chunking, threads or device. Scales are the same in both modes.
// The arithmetic lives in codec_math.h, shared with the CUDA kernels (codec_cuda.h).
#ifndef ATOLL_COMPRESSION_CODEC_H_
#define ATOLL_COMPRESSION_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec_spec.h"

namespace atl::compression {

std::string CodecName(Codec codec);
// A codec by name (codec_traits.h), with its default block size.
absl::StatusOr<CodecSpec> ParseCodec(const std::string& name);
// "fp32, bf16, int8, fp4_e2m1, fp4_e3m0 or fp8_e4m3 on the wire" (or the plain list): the codecs
// of this build (compression/codec_traits.h), for documentation and errors.
std::string CodecsHelp(bool on_the_wire = true);

// Every codec's name, in CodecsHelp's order.
std::vector<std::string> CodecNames();
// A config key's codec (compression/config_value.h): by name, with the codec's default block.
absl::Status ParseConfigValue(const std::string& text, CodecSpec* value);
std::string ConfigValueText(const CodecSpec& value);
// Refuses codec numbers this build does not implement and block sizes that do not fit the codec's
// rule (its row of codec_traits.h: int8 1..65536, fp4 even 2..4096, fp8 1..4096, int2 a multiple
// of 4, fp32/bf16 0). Sparse (topk > 0, compression/codec_sparse.h): chunks of 1..4096
// elements, topk at most the chunk, values in any codec.
absl::StatusOr<CodecSpec> MakeSpec(int codec, uint32_t block_size, uint32_t topk = 0);
// "fp4_e2m1", or "top-41/4096 int2" for a sparse spec.
std::string SpecText(const CodecSpec& spec);

// Bytes needed to encode n elements.
size_t EncodedBytes(const CodecSpec& spec, size_t n);

// Encodes n values into out[EncodedBytes(spec, n)]. Non-finite input is refused (INVALID_ARGUMENT
// naming the first bad index); out then holds no valid payload (the FP4 encoders find non-finite
// values in their one pass over the input). fp32 ignores `rounding`.
absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                    const Rounding& rounding = {});
// Decodes n values; `bytes` must equal EncodedBytes(spec, n). Refuses payloads that decode to
// non-finite values.
absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n, float* out);
// Decodes elements [first, first + count) of a payload of n elements (bytes must equal
// EncodedBytes(spec, n)) into out[count]: a bounded window of a large payload, with the same checks.
absl::Status DecodeSlice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                         size_t first, size_t count, float* out);

// Sparse specs only (spec.sparse(); INVALID_ARGUMENT otherwise), in time proportional to the
// values kept, not to n:
// The kept elements of [first, first + count) of a payload of n elements, handed to `visit` a
// chunk of the codec at a time: elements base + index[i] (ascending) hold value[i], i < m. The
// checks of DecodeSlice; an error stops the visits.
using KeptVisitor =
    std::function<void(size_t base, const uint32_t* index, const float* value, size_t m)>;
absl::Status VisitKept(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                       size_t first, size_t count, const KeptVisitor& visit);
// The same gathered: indices (payload offsets) appended to index, values to value.
absl::Status DecodeKept(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                        size_t first, size_t count, std::vector<uint32_t>* index,
                        std::vector<float>* value);
// Encode's very bytes for n values that are zero but at index[0, m) (ascending), value[m].
// `decoded`, when given, is handed what VisitKept would read of them, as they are written.
absl::Status EncodeSparseInput(const CodecSpec& spec, size_t n, const uint32_t* index,
                               const float* value, size_t m, uint8_t* out,
                               const Rounding& rounding = {},
                               const KeptVisitor* decoded = nullptr);

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CODEC_H_
