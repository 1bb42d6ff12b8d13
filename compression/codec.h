// Payload codecs: pure functions from fp32 spans to bytes and back. No torch, no gRPC, no I/O.
// The numeric values of Codec match atoll.v1.Codec on the wire.
#ifndef ATOLL_COMPRESSION_CODEC_H_
#define ATOLL_COMPRESSION_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace atl::compression {

enum class Codec : int {
  kFp32 = 1,
};

struct CodecSpec {
  Codec codec = Codec::kFp32;
  uint32_t block_size = 0;  // elements per scale block; 0 for codecs without scales
};

std::string CodecName(Codec codec);
// Refuses codec numbers this build does not implement and block sizes that do not fit the codec.
absl::StatusOr<CodecSpec> MakeSpec(int codec, uint32_t block_size);

// Bytes needed to encode n elements.
size_t EncodedBytes(const CodecSpec& spec, size_t n);

// Encodes n values into out[EncodedBytes(spec, n)]. Non-finite input is refused (INVALID_ARGUMENT
// naming the first bad index) before anything is written.
absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out);
// Decodes n values; `bytes` must equal EncodedBytes(spec, n). Refuses payloads that decode to
// non-finite values.
absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n, float* out);

}  // namespace atl::compression

#endif  // ATOLL_COMPRESSION_CODEC_H_
