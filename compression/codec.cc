#include "compression/codec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"
#include "compression/codec_sparse.h"
#include "compression/codec_traits.h"
#include "compression/config_value.h"
#include "compression/status_macros.h"

namespace atl::compression {
namespace {

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

absl::Status NonFiniteError(const float* in, size_t n) {
  const size_t bad = FirstNonFinite(in, n);
  return absl::InvalidArgumentError(
      absl::StrCat("non-finite value ", in[bad], " at element ", bad, " refused"));
}

absl::Status Unsupported(const CodecSpec& spec) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported codec ", int(spec.codec)));
}

}  // namespace

std::string CodecName(Codec codec) {
  if (const CodecTraits* t = FindCodec(codec)) return t->name;
  return absl::StrCat("codec#", int(codec));
}

absl::StatusOr<CodecSpec> ParseCodec(const std::string& name) {
  if (const CodecTraits* t = FindCodec(name)) return CodecSpec{t->id, t->default_block};
  return absl::InvalidArgumentError(absl::StrCat("unknown codec '", name, "'",
                                                 DidYouMean(name, CodecNames()), " (one of ",
                                                 CodecsHelp(/*on_the_wire=*/false), ")"));
}

std::vector<std::string> CodecNames() {
  size_t count = 0;
  const CodecTraits* const* codecs = Codecs(&count);
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) out.push_back(codecs[i]->name);
  return out;
}

std::string CodecsHelp(bool on_the_wire) {
  size_t count = 0;
  const CodecTraits* const* codecs = Codecs(&count);
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : (i + 1 == count && on_the_wire ? " or " : ", "),
                    codecs[i]->name);
  }
  return on_the_wire ? absl::StrCat(out, " on the wire") : out;
}

absl::Status ParseConfigValue(const std::string& text, CodecSpec* value) {
  ATL_ASSIGN_OR_RETURN(*value, ParseCodec(text));
  return absl::OkStatus();
}

std::string ConfigValueText(const CodecSpec& value) { return CodecName(value.codec); }

absl::StatusOr<CodecSpec> MakeSpec(int codec, uint32_t block_size, uint32_t topk) {
  const CodecTraits* t = FindCodec(Codec(codec));
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("unsupported codec ", codec));
  if (topk > 0) {
    if (block_size < 1 || block_size > sparse::kMaxChunk) {
      return absl::InvalidArgumentError(absl::StrCat("sparse ", t->name, " chunk of ", block_size,
                                                     " elements is invalid (1..",
                                                     sparse::kMaxChunk, ")"));
    }
    if (topk > block_size) {
      return absl::InvalidArgumentError(absl::StrCat("sparse ", t->name, " keeps ", topk,
                                                     " values of chunks of ", block_size));
    }
    return CodecSpec{t->id, block_size, topk};
  }
  auto bad_block = [&](const std::string& rule) {
    return absl::InvalidArgumentError(
        absl::StrCat(t->name, " block size ", block_size, " is invalid (", rule, ")"));
  };
  if (t->default_block == 0) {
    if (block_size != 0) return bad_block("this codec has no blocks");
  } else if (block_size < t->min_block || block_size > t->max_block ||
             block_size % t->block_multiple != 0) {
    return bad_block(absl::StrCat(
        t->block_multiple > 1 ? absl::StrCat("a multiple of ", t->block_multiple, ", ") : "",
        t->min_block, "..", t->max_block));
  }
  return CodecSpec{t->id, block_size};
}

std::string SpecText(const CodecSpec& spec) {
  if (!spec.sparse()) return CodecName(spec.codec);
  return absl::StrCat("top-", spec.topk, "/", spec.block_size, " ", CodecName(spec.codec));
}

size_t EncodedBytes(const CodecSpec& spec, size_t n) {
  const CodecTraits* t = FindCodec(spec.codec);
  if (t == nullptr) return 0;
  if (spec.sparse()) return sparse::EncodedBytes(spec, n);
  const size_t nblocks = spec.block_size ? (n + spec.block_size - 1) / spec.block_size : 0;
  return nblocks * t->block_bytes + (n * t->element_bits + 7) / 8;
}

absl::Status Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                    const Rounding& rounding) {
  const CodecTraits* row = FindCodec(spec.codec);
  if (row == nullptr) return Unsupported(spec);
  if (n == 0) return absl::OkStatus();
  const CodecTraits& t = *row;
  if (spec.sparse()) {
    // The selection looks at every magnitude: non-finite input shows in its result.
    if (sparse::Encode(spec, in, n, out, rounding) >= 0x7F800000u) return NonFiniteError(in, n);
    return absl::OkStatus();
  }
  // Encoders that see every magnitude anyway (block scales) find non-finite input in the same
  // pass; the others' input is checked first.
  if (!t.checks_finite && FirstNonFinite(in, n) < n) return NonFiniteError(in, n);
  const uint32_t amax_bits = t.encode(spec.block_size, in, n, out, rounding);
  if (t.checks_finite && amax_bits >= 0x7F800000u) return NonFiniteError(in, n);
  return absl::OkStatus();
}

absl::Status Decode(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n, float* out) {
  return DecodeSlice(spec, in, bytes, n, 0, n, out);
}

namespace {

// The checks of a read of elements [first, first + count) of a payload of n elements.
absl::Status CheckSlice(const CodecSpec& spec, size_t bytes, size_t n, size_t first,
                        size_t count) {
  if (bytes != EncodedBytes(spec, n)) {
    return absl::InvalidArgumentError(absl::StrCat(CodecName(spec.codec), " payload of ", n,
                                                   " elements must be ", EncodedBytes(spec, n),
                                                   " bytes, got ", bytes));
  }
  if (first > n || count > n - first) {
    return absl::OutOfRangeError(absl::StrCat("elements [", first, ", ", first + count,
                                              ") are outside the payload's ", n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeSlice(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                         size_t first, size_t count, float* out) {
  const CodecTraits* row = FindCodec(spec.codec);
  if (row == nullptr) return Unsupported(spec);
  ATL_RETURN_IF_ERROR(CheckSlice(spec, bytes, n, first, count));
  if (count == 0) return absl::OkStatus();
  if (spec.sparse()) {
    ATL_RETURN_IF_ERROR(sparse::DecodeSlice(spec, in, n, first, first + count, out));
  } else {
    ATL_RETURN_IF_ERROR(CheckBlocks(*row, spec.block_size, in, n, first, first + count));
    row->decode(spec.block_size, in, n, first, first + count, out);
  }
  if (const size_t bad = FirstNonFinite(out, count); bad < count) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload decodes to a non-finite value at element ", first + bad));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckSparse(const CodecSpec& spec, const char* what) {
  if (FindCodec(spec.codec) == nullptr) return Unsupported(spec);
  if (!spec.sparse()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " takes a sparse codec, got ", SpecText(spec)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeKept(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                        size_t first, size_t count, std::vector<uint32_t>* index,
                        std::vector<float>* value) {
  return VisitKept(spec, in, bytes, n, first, count,
                   [&](size_t base, const uint32_t* idx, const float* v, size_t m) {
                     for (size_t i = 0; i < m; ++i) index->push_back(uint32_t(base + idx[i]));
                     value->insert(value->end(), v, v + m);
                   });
}

absl::Status VisitKept(const CodecSpec& spec, const uint8_t* in, size_t bytes, size_t n,
                       size_t first, size_t count, const KeptVisitor& visit) {
  ATL_RETURN_IF_ERROR(CheckSparse(spec, "VisitKept"));
  ATL_RETURN_IF_ERROR(CheckSlice(spec, bytes, n, first, count));
  if (count == 0) return absl::OkStatus();
  return sparse::VisitKept(spec, in, n, first, first + count, visit);
}

absl::Status EncodeSparseInput(const CodecSpec& spec, size_t n, const uint32_t* index,
                               const float* value, size_t m, uint8_t* out,
                               const Rounding& rounding, const KeptVisitor* decoded) {
  ATL_RETURN_IF_ERROR(CheckSparse(spec, "EncodeSparseInput"));
  // Ascending with the last inside: all inside (flags gathered, the culprit named after).
  uint32_t bad = uint32_t(m > 0 && index[m - 1] >= n);
  for (size_t i = 1; i < m; ++i) bad |= uint32_t(index[i] <= index[i - 1]);
  for (size_t i = 0; bad && i < m; ++i) {
    if (index[i] >= n || (i > 0 && index[i] <= index[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index ", index[i], " at ", i, " is not ascending inside the ", n, " elements"));
    }
  }
  if (sparse::EncodeNonzeros(spec, n, index, value, m, out, rounding, decoded) >= 0x7F800000u) {
    for (size_t i = 0; i < m; ++i) {
      if (!std::isfinite(value[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot encode the non-finite value at element ", index[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace atl::compression
