#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace atl::compression {
namespace {

constexpr uint32_t kFp4DefaultBlock = 32;
constexpr uint32_t kInt8DefaultBlock = 64;

// Index of the first non-finite value, or n. Integer test on the exponent bits: vectorizes.
size_t FirstNonFinite(const float* v, size_t n) {
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, v + i, 4);
    any |= uint32_t((u & 0x7F800000u) == 0x7F800000u);
  }
  if (any == 0) return n;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even, for |y| < 2^22 (the default FP rounding mode does the work).
inline float RoundHalfEven(float y) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (y + kMagic) - kMagic;
}

// Largest magnitude of a block of finite values: as bit patterns, non-negative floats order like
// unsigned integers, which vectorizes.
float BlockAmax(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    m = std::max(m, u & 0x7FFFFFFFu);
  }
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

// floor(log2(a)) for finite a > 0, exact (subnormals included).
int FloorLog2(float a) {
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  return e - 1;
}

struct Fp4Format {
  int scale_offset;     // scale exponent = floor(log2 amax) - scale_offset
  float thresholds[7];  // the code is the number of thresholds a magnitude passes
  float magnitudes[8];
};

// Ties go to the even code: at the midpoint between codes c and c + 1 the result is whichever is
// even, so the threshold after an odd code is passed on equality and the one after an even code
// is not.
constexpr Fp4Format kE2M1 = {2,
                             {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f},
                             {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f}};
constexpr Fp4Format kE3M0 = {0,
                             {0.015625f, 0.046875f, 0.09375f, 0.1875f, 0.375f, 0.75f, 1.5f},
                             {0.0f, 0.03125f, 0.0625f, 0.125f, 0.25f, 0.5f, 1.0f, 2.0f}};

template <const Fp4Format& F>
inline uint8_t Fp4Code(float x, float inv_scale) {
  const float v = std::fabs(x) * inv_scale;
  const int m = int(v > F.thresholds[0]) + int(v >= F.thresholds[1]) + int(v > F.thresholds[2]) +
                int(v >= F.thresholds[3]) + int(v > F.thresholds[4]) + int(v >= F.thresholds[5]) +
                int(v > F.thresholds[6]);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const int sign = int(u >> 31) & int(m != 0);
  return uint8_t(m | (sign << 3));
}

template <const Fp4Format& F>
void EncodeFp4(uint32_t block, const float* in, size_t n, uint8_t* out) {
  const size_t nblocks = (n + block - 1) / block;
  uint8_t* scales = out;
  uint8_t* codes = out + nblocks;
  uint8_t tmp[4096 + 1];  // + 1: the pad of an odd last block
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float amax = BlockAmax(in + first, len);
    int e = amax > 0 ? FloorLog2(amax) - F.scale_offset : -127;
    e = std::clamp(e, -127, 127);
    scales[b] = uint8_t(e + 127);
    const float inv = std::ldexp(1.0f, -e);
    const float* src = in + first;
    for (size_t i = 0; i < len; ++i) tmp[i] = Fp4Code<F>(src[i], inv);
    tmp[len] = 0;  // pads an odd last block
    uint8_t* dst = codes + first / 2;  // blocks are even, so each starts on a byte
    for (size_t i = 0; i < (len + 1) / 2; ++i) dst[i] = uint8_t(tmp[2 * i] | (tmp[2 * i + 1] << 4));
  }
}

void DecodeFp4(const Fp4Format& f, uint32_t block, const uint8_t* in, size_t n, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  const uint8_t* codes = in + nblocks;
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float scale = std::ldexp(1.0f, int(in[b]) - 127);
    float table[16];
    for (int c = 0; c < 8; ++c) {
      table[c] = f.magnitudes[c] * scale;
      table[c + 8] = -table[c];
    }
    for (size_t i = 0; i < len; ++i) {
      const size_t k = first + i;
      out[k] = table[(codes[k / 2] >> ((k & 1) * 4)) & 0xF];
    }
  }
}

void EncodeInt8(uint32_t block, const float* in, size_t n, uint8_t* out) {
  const size_t nblocks = (n + block - 1) / block;
  int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nblocks);
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float scale = BlockAmax(in + first, len) / 127.0f;
    std::memcpy(out + 4 * b, &scale, 4);
    for (size_t i = 0; i < len; ++i) {
      const float y = scale > 0 ? RoundHalfEven(in[first + i] / scale) : 0.0f;
      q[first + i] = int8_t(std::clamp(y, -127.0f, 127.0f));
    }
  }
}

void DecodeInt8(uint32_t block, const uint8_t* in, size_t n, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nblocks);
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    for (size_t i = 0; i < len; ++i) out[first + i] = float(q[first + i]) * scale;
  }
}

void EncodeBf16(const float* in, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = Bits(in[i]);
    const uint16_t h = uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void DecodeBf16(const uint8_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = FromBits(uint32_t(h) << 16);
  }
}

}  // namespace

std::string CodecName(Codec codec) {
  switch (codec) {
    case Codec::kFp32: return "fp32";
    case Codec::kBf16: return "bf16";
    case Codec::kInt8: return "int8";
    case Codec::kFp4E2M1: return "fp4_e2m1";
    case Codec::kFp4E3M0: return "fp4_e3m0";
  }
  return absl::StrCat("codec#", int(codec));
}

absl::StatusOr<CodecSpec> ParseCodec(const std::string& name) {
  for (Codec c : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kFp4E2M1, Codec::kFp4E3M0}) {
    if (CodecName(c) != name) continue;
    const uint32_t block = c == Codec::kInt8 ? kInt8DefaultBlock
                           : (c == Codec::kFp4E2M1 || c == Codec::kFp4E3M0) ? kFp4DefaultBlock
                                                                             : 0;
    return CodecSpec{c, block};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec '", name, "' (one of fp32, bf16, int8, fp4_e2m1, fp4_e3m0)"));
}

absl::StatusOr<CodecSpec> MakeSpec(int codec, uint32_t block_size) {
  auto bad_block = [&](const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(Codec(codec)), " block size ",
                                                   block_size, " is invalid (", rule, ")"));
  };
  switch (Codec(codec)) {
    case Codec::kFp32:
    case Codec::kBf16:
      if (block_size != 0) return bad_block("this codec has no blocks");
      return CodecSpec{Codec(codec), 0};
    case Codec::kInt8:
      if (block_size < 1 || block_size > 65536) return bad_block("1..65536");
      return CodecSpec{Codec(codec), block_size};
    case Codec::kFp4E2M1:
    case Codec::kFp4E3M0:
      if (block_size < 2 || block_size > 4096 || block_size % 2 != 0) return bad_block("even, 2..4096");
      return CodecSpec{Codec(codec), block_size};
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported codec ", codec));
}

size_t EncodedBytes(const CodecSpec& spec, size_t n) {
  const size_t nblocks = spec.block_size ? (n + spec.block_size - 1) / spec.block_size : 0;
  switch (spec.codec) {
    case Codec::kFp32: return n * 4;
    case Codec::kBf16: return n * 2;
    case Codec::kInt8: return nblocks * 4 + n;
    case Codec::kFp4E2M1:
    case Codec::kFp4E3M0: return nblocks + (n + 1) / 2;
  }
  return 0;
}

absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out) {
  if (const size_t bad = FirstNonFinite(in, n); bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("non-finite value ", in[bad], " at element ", bad, " refused before encoding"));
  }
  switch (spec.codec) {
    case Codec::kFp32: std::memcpy(out, in, n * 4); break;
    case Codec::kBf16: EncodeBf16(in, n, out); break;
    case Codec::kInt8: EncodeInt8(spec.block_size, in, n, out); break;
    case Codec::kFp4E2M1: EncodeFp4<kE2M1>(spec.block_size, in, n, out); break;
    case Codec::kFp4E3M0: EncodeFp4<kE3M0>(spec.block_size, in, n, out); break;
  }
  return absl::OkStatus();
}

absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n, float* out) {
  if (bytes != EncodedBytes(spec, n)) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(spec.codec), " payload of ", n,
                                                   " elements must be ", EncodedBytes(spec, n),
                                                   " bytes, got ", bytes));
  }
  switch (spec.codec) {
    case Codec::kFp32: std::memcpy(out, in, bytes); break;
    case Codec::kBf16: DecodeBf16(in, n, out); break;
    case Codec::kInt8: DecodeInt8(spec.block_size, in, n, out); break;
    case Codec::kFp4E2M1: DecodeFp4(kE2M1, spec.block_size, in, n, out); break;
    case Codec::kFp4E3M0: DecodeFp4(kE3M0, spec.block_size, in, n, out); break;
  }
  if (const size_t bad = FirstNonFinite(out, n); bad < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload decodes to a non-finite value at element ", bad));
  }
  return absl::OkStatus();
}

}  // namespace atl::compression
