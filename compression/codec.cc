#include "compression/codec.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace atl::compression {
namespace {

// Index of the first non-finite value, or n.
size_t FirstNonFinite(const float* v, size_t n) {
  // Branch-free scan the compiler vectorizes; the index is only searched on failure.
  bool all_finite = true;
  for (size_t i = 0; i < n; ++i) all_finite &= std::isfinite(v[i]);
  if (all_finite) return n;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

}  // namespace

std::string CodecName(Codec codec) {
  switch (codec) {
    case Codec::kFp32: return "fp32";
  }
  return absl::StrCat("codec#", int(codec));
}

absl::StatusOr<CodecSpec> MakeSpec(int codec, uint32_t block_size) {
  if (codec == int(Codec::kFp32)) {
    if (block_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fp32 payloads have no blocks, got block size ", block_size));
    }
    return CodecSpec{Codec::kFp32, 0};
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported codec ", codec));
}

size_t EncodedBytes(const CodecSpec& spec, size_t n) {
  switch (spec.codec) {
    case Codec::kFp32: return n * sizeof(float);
  }
  return 0;
}

absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out) {
  if (const size_t bad = FirstNonFinite(in, n); bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("non-finite value ", in[bad], " at element ", bad, " refused before encoding"));
  }
  switch (spec.codec) {
    case Codec::kFp32:
      std::memcpy(out, in, n * sizeof(float));
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unsupported codec");
}

absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n, float* out) {
  if (bytes != EncodedBytes(spec, n)) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(spec.codec), " payload of ", n,
                                                   " elements must be ", EncodedBytes(spec, n),
                                                   " bytes, got ", bytes));
  }
  switch (spec.codec) {
    case Codec::kFp32:
      std::memcpy(out, in, bytes);
      break;
  }
  if (const size_t bad = FirstNonFinite(out, n); bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload decodes to a non-finite value at element ", bad));
  }
  return absl::OkStatus();
}

}  // namespace atl::compression
