#include "compression/codec_sparse.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"

namespace atl::compression::sparse {
namespace {

using math::AbsBits;

// What one chunk of `len` elements holds.
struct Shape {
  uint32_t k = 0;           // values kept
  uint32_t l = 0;           // Elias-Fano low bits per index
  size_t value_bytes = 0;   // the values' payload
  size_t upper_bits = 0;    // the high parts, unary
  size_t index_bytes = 0;   // low bits and high parts, padded to a byte
};

const CodecTraits& Values(const CodecSpec& spec) { return *FindCodec(spec.codec); }

// The kept values are one block of the value codec (codecs without blocks: none).
uint32_t ValueBlock(const CodecTraits& t, uint32_t k) { return t.default_block ? k : 0; }

Shape ShapeOf(const CodecSpec& spec, size_t len) {
  const CodecTraits& t = Values(spec);
  Shape s;
  s.k = uint32_t(std::min<size_t>(spec.topk, len));
  while ((uint64_t(s.k) << (s.l + 1)) <= len) ++s.l;  // floor(log2(len / k))
  s.value_bytes = (t.default_block ? t.block_bytes : 0) + (size_t(s.k) * t.element_bits + 7) / 8;
  s.upper_bits = s.k + ((len - 1) >> s.l) + 1;
  s.index_bytes = (size_t(s.k) * s.l + s.upper_bits + 7) / 8;
  return s;
}

// Bit strings, least significant bit first; `out` starts zeroed.
void PutBits(uint8_t* out, size_t pos, uint32_t value, uint32_t nbits) {
  for (uint32_t done = 0; done < nbits;) {
    const uint32_t off = uint32_t(pos & 7), take = std::min(8 - off, nbits - done);
    out[pos >> 3] = uint8_t(out[pos >> 3] | (((value >> done) & ((1u << take) - 1)) << off));
    pos += take;
    done += take;
  }
}

uint32_t GetBits(const uint8_t* in, size_t pos, uint32_t nbits) {
  uint32_t value = 0;
  for (uint32_t done = 0; done < nbits;) {
    const uint32_t off = uint32_t(pos & 7), take = std::min(8 - off, nbits - done);
    value |= ((uint32_t(in[pos >> 3]) >> off) & ((1u << take) - 1)) << done;
    pos += take;
    done += take;
  }
  return value;
}

// The first set bit of bits [pos, end) of `in`, or end.
size_t NextSetBit(const uint8_t* in, size_t pos, size_t end) {
  while (pos < end) {
    const uint32_t byte = uint32_t(in[pos >> 3]) >> (pos & 7);
    if (byte != 0) return std::min(end, pos + size_t(__builtin_ctz(byte)));
    pos = (pos | 7) + 1;
  }
  return end;
}

struct Scratch {
  std::vector<uint32_t> idx;
  std::vector<float> values;
  std::vector<std::pair<uint32_t, uint32_t>> candidates;  // (magnitude bits, index)
};

Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

uint32_t EncodeChunk(const CodecSpec& spec, const float* x, uint32_t len, uint8_t* out,
                     const Rounding& rounding) {
  const CodecTraits& t = Values(spec);
  const Shape s = ShapeOf(spec, len);
  Scratch& scratch = ThreadScratch();
  scratch.idx.resize(len);
  scratch.values.resize(len);
  uint32_t* idx = scratch.idx.data();
  const uint32_t amax = SelectTopK(x, len, s.k, idx);
  if (amax >= 0x7F800000u) return amax;
  for (uint32_t i = 0; i < s.k; ++i) scratch.values[i] = x[idx[i]];
  t.encode(ValueBlock(t, s.k), scratch.values.data(), s.k, out, rounding);
  uint8_t* bits = out + s.value_bytes;
  std::memset(bits, 0, s.index_bytes);
  const uint32_t low_mask = (1u << s.l) - 1;
  for (uint32_t i = 0; i < s.k; ++i) PutBits(bits, size_t(i) * s.l, idx[i] & low_mask, s.l);
  const size_t upper = size_t(s.k) * s.l;
  for (uint32_t i = 0; i < s.k; ++i) {
    const size_t p = upper + (idx[i] >> s.l) + i;
    bits[p >> 3] = uint8_t(bits[p >> 3] | (1u << (p & 7)));
  }
  return amax;
}

// The chunk's indices into idx[s.k], checked: ascending, distinct, inside the chunk, exactly k.
absl::Status ReadIndices(const uint8_t* bits, const Shape& s, size_t len, size_t chunk,
                         uint32_t* idx) {
  auto refuse = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("sparse chunk ", chunk, " (", len,
                                                   " elements, ", s.k, " kept): ", what));
  };
  const size_t upper = size_t(s.k) * s.l, end = upper + s.upper_bits;
  size_t pos = upper;
  for (uint32_t i = 0; i < s.k; ++i) {
    const size_t p = NextSetBit(bits, pos, end);
    if (p == end) return refuse(absl::StrCat("the index list ends after ", i, " indices"));
    const uint64_t high = p - upper - i;
    const uint64_t index = (high << s.l) | GetBits(bits, size_t(i) * s.l, s.l);
    if (index >= len) return refuse(absl::StrCat("index ", index, " is outside the chunk"));
    if (i > 0 && index <= idx[i - 1]) {
      return refuse(absl::StrCat("index ", index, " follows ", idx[i - 1],
                                 " (indices must be ascending and distinct)"));
    }
    idx[i] = uint32_t(index);
    pos = p + 1;
  }
  if (NextSetBit(bits, pos, end) != end) return refuse("the index list holds more indices than kept");
  return absl::OkStatus();
}

}  // namespace

uint32_t SelectTopK(const float* x, uint32_t len, uint32_t k, uint32_t* idx) {
  Scratch& scratch = ThreadScratch();
  // One pass: the largest magnitude and a histogram of the top 10 magnitude bits (exponent and
  // 2 mantissa bits; two interleaved histograms, so that neighbours in one bin do not wait on
  // each other).
  constexpr int kShift = 21;
  uint32_t hist[2][1024] = {};
  uint32_t amax = 0;
  uint32_t i = 0;
  for (; i + 2 <= len; i += 2) {
    const uint32_t a = AbsBits(x[i]), b = AbsBits(x[i + 1]);
    amax = std::max(amax, std::max(a, b));
    ++hist[0][a >> kShift];
    ++hist[1][b >> kShift];
  }
  if (i < len) {
    const uint32_t a = AbsBits(x[i]);
    amax = std::max(amax, a);
    ++hist[0][a >> kShift];
  }
  if (k >= len) {
    std::iota(idx, idx + len, 0u);
    return amax;
  }
  if (amax >= 0x7F800000u || k == 0) return amax;
  // From the largest magnitude's bin down to the one holding the k-th largest: everything from
  // there up is a candidate (about k plus that bin).
  uint32_t above = 0, bin = amax >> kShift;
  for (;; --bin) {
    above += hist[0][bin] + hist[1][bin];
    if (above >= k) break;
  }
  auto& cand = scratch.candidates;
  if (cand.size() < len) cand.resize(len);
  std::pair<uint32_t, uint32_t>* c = cand.data();
  const uint32_t floor_bits = bin << kShift;
  uint32_t m = 0;
  for (uint32_t j = 0; j < len; ++j) {  // branch-free: every element written, the kept counted
    const uint32_t b = AbsBits(x[j]);
    c[m] = {b, j};
    m += uint32_t(b >= floor_bits);
  }
  // The k first by magnitude, ties to the lower index; then in index order.
  auto before = [](const std::pair<uint32_t, uint32_t>& a, const std::pair<uint32_t, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  if (m > k) std::nth_element(c, c + (k - 1), c + m, before);
  for (uint32_t j = 0; j < k; ++j) idx[j] = c[j].second;
  std::sort(idx, idx + k);
  return amax;
}

size_t ChunkBytes(const CodecSpec& spec, size_t len) {
  const Shape s = ShapeOf(spec, len);
  return s.value_bytes + s.index_bytes;
}

size_t EncodedBytes(const CodecSpec& spec, size_t n) {
  const size_t c = spec.block_size, full = n / c, rest = n % c;
  return full * ChunkBytes(spec, c) + (rest ? ChunkBytes(spec, rest) : 0);
}

uint32_t Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                const Rounding& rounding) {
  const size_t c = spec.block_size;
  uint32_t amax = 0;
  for (size_t first = 0; first < n; first += c) {
    const uint32_t len = uint32_t(std::min(c, n - first));
    // Each chunk's kept values draw from the indices of the chunk's first elements: the same
    // draws however the payload is cut (on the chunk grid).
    Rounding r = rounding;
    r.first_index = rounding.first_index + first;
    amax = std::max(amax, EncodeChunk(spec, in + first, len, out, r));
    if (amax >= 0x7F800000u) return amax;
    out += ChunkBytes(spec, len);
  }
  return amax;
}

absl::Status DecodeSlice(const CodecSpec& spec, const uint8_t* in, size_t n, size_t first,
                         size_t last, float* out) {
  const CodecTraits& t = Values(spec);
  const size_t c = spec.block_size, full_bytes = ChunkBytes(spec, c);
  Scratch& scratch = ThreadScratch();
  scratch.idx.resize(c);
  scratch.values.resize(c);
  std::fill(out, out + (last - first), 0.0f);
  for (size_t j = first / c; j * c < last; ++j) {
    const size_t start = j * c, len = std::min(c, n - start);
    const Shape s = ShapeOf(spec, len);
    const uint8_t* p = in + j * full_bytes;
    const absl::Status read = ReadIndices(p + s.value_bytes, s, len, j, scratch.idx.data());
    if (!read.ok()) return read;
    t.decode(ValueBlock(t, s.k), p, s.k, 0, s.k, scratch.values.data());
    const size_t a = std::max(first, start), b = std::min(last, start + len);
    for (uint32_t i = 0; i < s.k; ++i) {
      const size_t g = start + scratch.idx[i];
      if (g >= a && g < b) out[g - first] = scratch.values[i];
    }
  }
  return absl::OkStatus();
}

SliceLayout SliceOf(const CodecSpec& spec, size_t n, size_t first, size_t last) {
  SliceLayout s;
  s.blocks_offset = (first / spec.block_size) * ChunkBytes(spec, spec.block_size);
  s.blocks_bytes = EncodedBytes(spec, last - first);
  s.elements_offset = EncodedBytes(spec, n);
  s.elements_bytes = 0;
  return s;
}

}  // namespace atl::compression::sparse
