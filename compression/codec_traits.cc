#include "compression/codec_traits.h"

#include "absl/strings/str_cat.h"

#include "compression/codec_rows.h"
#include "compression/codec_sparse.h"

namespace atl::compression {
namespace {

// Every codec of this build, in Codec order.
const CodecTraits* const kCodecs[] = {&kFp32Codec,    &kBf16Codec,    &kInt8Codec,
                                      &kFp4E2M1Codec, &kFp4E3M0Codec, &kFp8E4M3Codec,
                                      &kInt2Codec,    &kInt2CentroidCodec};

}  // namespace

const CodecTraits* const* Codecs(size_t* count) {
  *count = sizeof(kCodecs) / sizeof(kCodecs[0]);
  return kCodecs;
}

const CodecTraits* FindCodec(Codec codec) {
  for (const CodecTraits* c : kCodecs) {
    if (c->id == codec) return c;
  }
  return nullptr;
}

const CodecTraits* FindCodec(const std::string& name) {
  for (const CodecTraits* c : kCodecs) {
    if (name == c->name) return c;
  }
  return nullptr;
}

absl::Status CheckBlocks(const CodecTraits& t, uint32_t block, const uint8_t* in, size_t n,
                         size_t first, size_t last) {
  if (t.malformed_block == nullptr || first >= last) return absl::OkStatus();
  size_t bad = 0;
  const char* what = t.malformed_block(block, in, n, first, last, &bad);
  if (what == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(t.name, " block ", bad, " (elements from ",
                                                 bad * block, ") is malformed: ", what));
}

SliceLayout SliceOf(const CodecSpec& spec, size_t n, size_t first, size_t last) {
  const CodecTraits* t = FindCodec(spec.codec);
  SliceLayout s;
  if (t == nullptr) return s;
  if (spec.sparse()) return sparse::SliceOf(spec, n, first, last);
  const size_t block = spec.block_size > 0 ? spec.block_size : 1;
  const size_t nblocks = spec.block_size > 0 ? (n + block - 1) / block : 0;
  if (spec.block_size > 0) {
    s.blocks_offset = size_t(t->block_bytes) * (first / block);
    s.blocks_bytes = size_t(t->block_bytes) * ((last - first + block - 1) / block);
  }
  const size_t bits = t->element_bits;
  s.elements_offset = size_t(t->block_bytes) * nblocks + first * bits / 8;
  s.elements_bytes = ((last - first) * bits + 7) / 8;
  return s;
}

}  // namespace atl::compression
