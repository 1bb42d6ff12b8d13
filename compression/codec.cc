#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"
#include "compression/codec_simd.h"
#include "compression/status_macros.h"

namespace atl::compression {
namespace {

constexpr uint32_t kFp4DefaultBlock = 32;
constexpr uint32_t kInt8DefaultBlock = 64;

// Index of the first non-finite value, or n. Integer test on the exponent bits: vectorizes.
size_t FirstNonFinite(const float* v, size_t n) {
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) any |= uint32_t(!math::IsFinite(v[i]));
  if (any == 0) return n;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return n;
}

using namespace math;  // NOLINT: this file is the CPU side of codec_math.h

// Largest magnitude of a block of finite values: as bit patterns, non-negative floats order like
// unsigned integers, which vectorizes.
float BlockAmax(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, AbsBits(x[i]));
  return FromBits(m);
}

// Whole blocks of a block size known at compile time (MXFP4's 32): the compiler unrolls and
// vectorizes the amax, the codes and the packing of each block as one unit.
// Returns the largest magnitude seen, as bits (non-finite input shows as >= 0x7F800000).
template <class F, uint32_t kBlock>
uint32_t EncodeFp4FullBlocks(size_t nblocks, const float* in, uint8_t* scales, uint8_t* codes) {
  uint32_t all = 0;
  for (size_t b = 0; b < nblocks; ++b) {
    const float* src = in + b * kBlock;
    uint32_t m = 0;
    for (uint32_t i = 0; i < kBlock; ++i) m = std::max(m, AbsBits(src[i]));
    all = std::max(all, m);
    const int e = Fp4ScaleExponent<F>(FromBits(m));
    scales[b] = uint8_t(e + 127);
    const float inv = Pow2(-e);
    const int max_code = F::MaxCode(e);
    uint8_t c[kBlock];
    for (uint32_t i = 0; i < kBlock; ++i) c[i] = Fp4Nearest<F>(src[i], inv, max_code);
    uint8_t* dst = codes + b * (kBlock / 2);
    for (uint32_t i = 0; i < kBlock / 2; ++i) dst[i] = uint8_t(c[2 * i] | (c[2 * i + 1] << 4));
  }
  return all;
}

// Returns the largest magnitude seen, as bits: the caller refuses non-finite input afterwards, so
// that the values are read once.
template <class F, bool kStochastic>
uint32_t EncodeFp4(uint32_t block, const float* in, size_t n, uint8_t* out,
                   const Rounding& rounding) {
  const size_t nblocks = (n + block - 1) / block;
  uint8_t* scales = out;
  uint8_t* codes = out + nblocks;
  size_t b = 0;
  uint32_t all = 0;
  if (!kStochastic && block == 32) {
    b = n / 32;  // whole blocks; the general loop does a partial last one
    all = simd::Enabled() ? simd::EncodeFp4Blocks32(F::kCodec, b, in, scales, codes)
                          : EncodeFp4FullBlocks<F, 32>(b, in, scales, codes);
  }
  uint8_t tmp[4096 + 1];  // + 1: the pad of an odd last block
  for (; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float amax = BlockAmax(in + first, len);
    all = std::max(all, AbsBits(amax));
    const int e = Fp4ScaleExponent<F>(amax);
    scales[b] = uint8_t(e + 127);
    const float inv = Pow2(-e);
    const int max_code = F::MaxCode(e);
    const float* src = in + first;
    if constexpr (kStochastic) {
      const uint64_t base = rounding.first_index + first;
      for (size_t i = 0; i < len; ++i) {
        tmp[i] = Fp4Stochastic<F>(src[i], inv, Uniform(rounding.seed, base + i), max_code);
      }
    } else {
      for (size_t i = 0; i < len; ++i) tmp[i] = Fp4Nearest<F>(src[i], inv, max_code);
    }
    tmp[len] = 0;  // pads an odd last block
    uint8_t* dst = codes + first / 2;  // blocks are even, so each starts on a byte
    for (size_t i = 0; i < (len + 1) / 2; ++i) dst[i] = uint8_t(tmp[2 * i] | (tmp[2 * i + 1] << 4));
  }
  return all;
}

// Elements [lo, hi) of a payload of nblocks blocks into out[0, hi - lo).
template <class F>
void DecodeFp4Scalar(uint32_t block, const uint8_t* in, size_t nblocks, size_t lo, size_t hi,
                     float* out) {
  const uint8_t* codes = in + nblocks;
  for (size_t b = lo / block; b * block < hi; ++b) {
    const size_t first = std::max(b * block, lo), last = std::min((b + 1) * block, hi);
    const float scale = Pow2(int(in[b]) - 127);
    float table[16];
    for (int c = 0; c < 16; ++c) table[c] = Fp4Value<F>(uint8_t(c), scale);
    for (size_t k = first; k < last; ++k) out[k - lo] = table[(codes[k / 2] >> ((k & 1) * 4)) & 0xF];
  }
}

// Elements [lo, hi) of an n-element payload into out[0, hi - lo): the whole blocks of 32 inside
// the range by the vector kernel when there is one, the rest by the scalar loop.
template <class F>
void DecodeFp4(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  if (block != 32 || !simd::Enabled()) return DecodeFp4Scalar<F>(block, in, nblocks, lo, hi, out);
  const size_t first_block = (lo + 31) / 32, last_block = hi / 32;  // whole blocks: [first, last)
  if (first_block >= last_block) return DecodeFp4Scalar<F>(block, in, nblocks, lo, hi, out);
  DecodeFp4Scalar<F>(block, in, nblocks, lo, first_block * 32, out);
  simd::DecodeFp4Blocks32(F::kCodec, last_block - first_block, in + first_block,
                          in + nblocks + first_block * 16, out + (first_block * 32 - lo));
  DecodeFp4Scalar<F>(block, in, nblocks, last_block * 32, hi, out + (last_block * 32 - lo));
}

void EncodeInt8(uint32_t block, const float* in, size_t n, uint8_t* out, const Rounding& rounding) {
  const size_t nblocks = (n + block - 1) / block;
  int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nblocks);
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t first = b * block, len = std::min<size_t>(block, n - first);
    const float scale = Int8Scale(BlockAmax(in + first, len));
    std::memcpy(out + 4 * b, &scale, 4);
    if (rounding.stochastic) {
      for (size_t i = 0; i < len; ++i) {
        const uint64_t k = first + i;
        q[k] = Int8Stochastic(in[k], scale, Uniform(rounding.seed, rounding.first_index + k));
      }
    } else {
      for (size_t i = 0; i < len; ++i) q[first + i] = Int8Nearest(in[first + i], scale);
    }
  }
}

void DecodeInt8(uint32_t block, const uint8_t* in, size_t n, size_t lo, size_t hi, float* out) {
  const size_t nblocks = (n + block - 1) / block;
  const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nblocks);
  for (size_t b = lo / block; b * block < hi; ++b) {
    const size_t first = std::max(b * block, lo), last = std::min((b + 1) * block, hi);
    float scale;
    std::memcpy(&scale, in + 4 * b, 4);
    for (size_t k = first; k < last; ++k) out[k - lo] = float(q[k]) * scale;
  }
}

void EncodeBf16(const float* in, size_t n, uint8_t* out, const Rounding& rounding) {
  if (rounding.stochastic) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = Bf16Stochastic(in[i], rounding.seed, rounding.first_index + i);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {  // a separate loop, so that the compiler vectorizes it
    const uint16_t h = Bf16Nearest(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void DecodeBf16(const uint8_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Bf16Value(h);
  }
}

template <class F>
uint32_t EncodeFp4(uint32_t block, const float* in, size_t n, uint8_t* out,
                   const Rounding& rounding) {
  return rounding.stochastic ? EncodeFp4<F, true>(block, in, n, out, rounding)
                             : EncodeFp4<F, false>(block, in, n, out, rounding);
}

absl::Status NonFiniteError(const float* in, size_t n) {
  const size_t bad = FirstNonFinite(in, n);
  return absl::InvalidArgumentError(
      absl::StrCat("non-finite value ", in[bad], " at element ", bad, " refused"));
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

std::string CodecsHelp() { return "fp32, bf16, int8, fp4_e2m1 or fp4_e3m0 on the wire"; }

absl::Status ParseConfigValue(const std::string& text, CodecSpec* value) {
  ATL_ASSIGN_OR_RETURN(*value, ParseCodec(text));
  return absl::OkStatus();
}

std::string ConfigValueText(const CodecSpec& value) { return CodecName(value.codec); }

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

absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                    const Rounding& rounding) {
  if (n == 0) return absl::OkStatus();
  // The FP4 encoders see every magnitude anyway (the block scales): they find non-finite input
  // in the same pass. The others are checked first.
  const bool fp4 = spec.codec == Codec::kFp4E2M1 || spec.codec == Codec::kFp4E3M0;
  if (!fp4 && FirstNonFinite(in, n) < n) return NonFiniteError(in, n);
  uint32_t amax_bits = 0;
  switch (spec.codec) {
    case Codec::kFp32: std::memcpy(out, in, n * 4); break;
    case Codec::kBf16: EncodeBf16(in, n, out, rounding); break;
    case Codec::kInt8: EncodeInt8(spec.block_size, in, n, out, rounding); break;
    case Codec::kFp4E2M1: amax_bits = EncodeFp4<E2M1>(spec.block_size, in, n, out, rounding); break;
    case Codec::kFp4E3M0: amax_bits = EncodeFp4<E3M0>(spec.block_size, in, n, out, rounding); break;
  }
  if (amax_bits >= 0x7F800000u) return NonFiniteError(in, n);
  return absl::OkStatus();
}

absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n, float* out) {
  return DecodeSlice(spec, in, bytes, n, 0, n, out);
}

absl::Status DecodeSlice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                         size_t first, size_t count, float* out) {
  if (bytes != EncodedBytes(spec, n)) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(spec.codec), " payload of ", n,
                                                   " elements must be ", EncodedBytes(spec, n),
                                                   " bytes, got ", bytes));
  }
  if (first > n || count > n - first) {
    return absl::OutOfRangeError(absl::StrCat("elements [", first, ", ", first + count,
                                              ") are outside the payload's ", n));
  }
  if (count == 0) return absl::OkStatus();
  const size_t last = first + count;
  switch (spec.codec) {
    case Codec::kFp32: std::memcpy(out, in + 4 * first, 4 * count); break;
    case Codec::kBf16: DecodeBf16(in + 2 * first, count, out); break;
    case Codec::kInt8: DecodeInt8(spec.block_size, in, n, first, last, out); break;
    case Codec::kFp4E2M1: DecodeFp4<E2M1>(spec.block_size, in, n, first, last, out); break;
    case Codec::kFp4E3M0: DecodeFp4<E3M0>(spec.block_size, in, n, first, last, out); break;
  }
  if (const size_t bad = FirstNonFinite(out, count); bad < count) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload decodes to a non-finite value at element ", first + bad));
  }
  return absl::OkStatus();
}

}  // namespace atl::compression
