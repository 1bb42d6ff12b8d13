#include "compression/codec_sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compression/codec_math.h"
#include "compression/codec_simd.h"
#include "compression/sparse_shape.h"
#include "compression/status_macros.h"

namespace atl::compression::sparse {
namespace {

using math::AbsBits;

const CodecTraits& Values(const CodecSpec& spec) { return *FindCodec(spec.codec); }

// The kept values are one block of the value codec (codecs without blocks: none).
uint32_t ValueBlock(const CodecTraits& t, uint32_t k) { return t.default_block ? k : 0; }

// A payload's chunks (spec.block_size elements each but the last): the value codec looked up and
// the full chunk's shape computed once, not per chunk.
struct Chunks {
  explicit Chunks(const CodecSpec& spec)
      : traits(Values(spec)), layout(ValueLayoutOf(traits)), topk(spec.topk),
        size(spec.block_size), full(sparse::ShapeOf(topk, size, layout)) {}
  Shape Of(size_t len) const { return len == size ? full : sparse::ShapeOf(topk, len, layout); }
  static size_t Bytes(const Shape& s) { return s.value_bytes + s.index_bytes; }

  const CodecTraits& traits;
  const ValueLayout layout;
  const uint32_t topk;
  const size_t size;
  const Shape full;
};


struct Scratch {
  std::vector<uint32_t> idx;
  std::vector<float> values;
  std::vector<uint32_t> passing;  // indices at or above the floor
  std::vector<uint64_t> keys;     // their magnitudes' bits, then ~index
  std::vector<uint32_t> zeros;    // a sparse input's zeros kept, and their values
  std::vector<float> zero_values;
};

Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

// ORs `word` into bits [64 w, 64 w + 64) of the bit string bits[bytes] (LSB first).
inline void OrWord(uint8_t* bits, size_t bytes, size_t w, uint64_t word) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the bit strings are written as words");
  if (8 * w + 8 <= bytes) {
    uint64_t x;
    std::memcpy(&x, bits + 8 * w, 8);
    x |= word;
    std::memcpy(bits + 8 * w, &x, 8);
    return;
  }
  for (size_t b = 8 * w; b < bytes; ++b, word >>= 8) bits[b] = uint8_t(bits[b] | uint8_t(word));
}

// A chunk of `len` elements whose kept elements are idx[s.k] (ascending) with values[s.k].
void EncodeSelected(const CodecTraits& t, const Shape& s, const uint32_t* idx, const float* values,
                    uint8_t* out, const Rounding& rounding) {
  t.encode(ValueBlock(t, s.k), values, s.k, out, rounding);
  uint8_t* bits = out + s.value_bytes;
  std::memset(bits, 0, s.index_bytes);
  // The low bits, LSB first from bit 0: gathered in a word and stored 32 bits at a time.
  const uint32_t low_mask = (1u << s.l) - 1;
  uint64_t acc = 0;
  uint32_t held = 0;
  uint8_t* at = bits;
  for (uint32_t i = 0; i < s.k; ++i) {
    acc |= uint64_t(idx[i] & low_mask) << held;
    held += s.l;
    if (held >= 32) {
      const uint32_t word = uint32_t(acc);
      std::memcpy(at, &word, 4);
      at += 4;
      acc >>= 32;
      held -= 32;
    }
  }
  for (; held > 0; held = held > 8 ? held - 8 : 0, acc >>= 8) *at++ = uint8_t(acc);
  // The high parts, unary after the low bits (which may share their first byte): a 64-bit word
  // of them at a time.
  const size_t upper = size_t(s.k) * s.l;
  size_t w = upper >> 6;
  uint64_t word = 0;
  for (uint32_t i = 0; i < s.k; ++i) {
    const size_t p = upper + (idx[i] >> s.l) + i;
    if ((p >> 6) != w) {
      OrWord(bits, s.index_bytes, w, word);
      w = p >> 6;
      word = 0;
    }
    word |= uint64_t(1) << (p & 63);
  }
  if (word != 0) OrWord(bits, s.index_bytes, w, word);
}

uint32_t EncodeChunk(const CodecTraits& t, const Shape& s, const float* x, uint32_t len,
                     uint8_t* out, const Rounding& rounding) {
  Scratch& scratch = ThreadScratch();
  scratch.idx.resize(len);
  scratch.values.resize(len);
  uint32_t* idx = scratch.idx.data();
  const uint32_t amax = SelectTopK(x, len, s.k, idx);
  if (amax >= 0x7F800000u) return amax;
  for (uint32_t i = 0; i < s.k; ++i) scratch.values[i] = x[idx[i]];
  EncodeSelected(t, s, idx, scratch.values.data(), out, rounding);
  return amax;
}

// The same chunk when x is zero but at at[m] - base (ascending) with values v[m]: top-k keeps every
// nonzero and, ties to the lower index, the first zeros (an entry of either sign's zero is one,
// kept with its sign). Returns false when more than k are nonzero.
bool EncodeChunkFromEntries(const CodecTraits& t, const Shape& s, uint32_t len, const uint32_t* at,
                            uint32_t base, const float* v, uint32_t m, uint8_t* out,
                            const Rounding& rounding) {
  uint32_t nonzero = 0;
  for (uint32_t i = 0; i < m; ++i) nonzero += uint32_t(v[i] != 0.0f);
  if (nonzero > s.k) return false;
  Scratch& scratch = ThreadScratch();
  scratch.idx.resize(s.k);
  scratch.values.resize(s.k);
  uint32_t* idx = scratch.idx.data();
  float* values = scratch.values.data();
  if (nonzero == m) {
    // No entry is a zero: the k - m zeros kept are the lowest indices without an entry, merged
    // in as they are found.
    uint32_t kept = 0, i = 0;
    for (uint32_t j = 0, zeros = s.k - m; zeros > 0; ++j, ++kept) {
      const bool entry = i < m && at[i] - base == j;
      idx[kept] = j;
      values[kept] = entry ? v[i] : 0.0f;
      i += uint32_t(entry);
      zeros -= uint32_t(!entry);
    }
    for (; i < m; ++i, ++kept) {
      idx[kept] = at[i] - base;
      values[kept] = v[i];
    }
    EncodeSelected(t, s, idx, values, out, rounding);
    return true;
  }
  // The zeros kept: the k - nonzero lowest indices that hold no nonzero (a short walk).
  std::vector<uint32_t>& zeros = scratch.zeros;
  std::vector<float>& zero_values = scratch.zero_values;
  zeros.clear();
  zero_values.clear();
  for (uint32_t j = 0, i = 0; zeros.size() < s.k - nonzero; ++j) {
    while (i < m && at[i] - base < j) ++i;
    const bool entry = i < m && at[i] - base == j;
    if (entry && v[i] != 0.0f) continue;
    zeros.push_back(j);
    zero_values.push_back(entry ? v[i] : 0.0f);
  }
  // Both merged in index order.
  uint32_t kept = 0, i = 0;
  auto nonzeros_before = [&](uint32_t end) {
    for (; i < m && at[i] - base < end; ++i) {
      if (v[i] == 0.0f) continue;
      idx[kept] = at[i] - base;
      values[kept++] = v[i];
    }
  };
  for (size_t z = 0; z < zeros.size(); ++z) {
    nonzeros_before(zeros[z]);
    idx[kept] = zeros[z];
    values[kept++] = zero_values[z];
  }
  nonzeros_before(len);
  EncodeSelected(t, s, idx, values, out, rounding);
  return true;
}

// Bits [pos, pos + 64) of the bit string bits[bytes] (LSB first; beyond its end: zeros), as one
// little-endian word: a 64-bit load where it fits.
inline uint64_t Word(const uint8_t* bits, size_t bytes, size_t pos) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the bit strings are read as words");
  const size_t byte = pos >> 3;
  uint64_t w = 0;
  if (byte + 8 <= bytes) {
    std::memcpy(&w, bits + byte, 8);
  } else if (byte < bytes) {
    std::memcpy(&w, bits + byte, bytes - byte);
  }
  w >>= (pos & 7);
  if ((pos & 7) != 0 && byte + 8 < bytes) w |= uint64_t(bits[byte + 8]) << (64 - (pos & 7));
  return w;
}

// The chunk's indices into idx[s.k], checked: ascending, distinct, inside the chunk, exactly k.
// The high parts' set bits are found a word at a time.
absl::Status ReadIndices(const uint8_t* bits, const Shape& s, size_t len, size_t chunk,
                         uint32_t* idx) {
  auto refuse = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("sparse chunk ", chunk, " (", len,
                                                   " elements, ", s.k, " kept): ", what));
  };
  const size_t upper = size_t(s.k) * s.l, end = upper + s.upper_bits;
  const uint64_t low_mask = (uint64_t(1) << s.l) - 1;
  // The low bits stream from bit 0 (k x l bits, before the upper part): a byte at a time.
  uint64_t acc = 0;
  uint32_t held = 0;
  const uint8_t* next = bits;
  uint32_t i = 0;
  for (size_t pos = upper; pos < end; pos += 64) {
    uint64_t w = Word(bits, s.index_bytes, pos);
    if (end - pos < 64) w &= (uint64_t(1) << (end - pos)) - 1;
    for (; w != 0; w &= w - 1) {
      if (i == s.k) return refuse("the index list holds more indices than kept");
      const uint64_t high = pos + size_t(__builtin_ctzll(w)) - upper - i;
      for (; held < s.l; held += 8) acc |= uint64_t(*next++) << held;
      const uint64_t low = acc & low_mask;
      acc >>= s.l;
      held -= s.l;
      const uint64_t index = (high << s.l) | low;
      if (index >= len) return refuse(absl::StrCat("index ", index, " is outside the chunk"));
      if (i > 0 && index <= idx[i - 1]) {
        return refuse(absl::StrCat("index ", index, " follows ", idx[i - 1],
                                   " (indices must be ascending and distinct)"));
      }
      idx[i++] = uint32_t(index);
    }
  }
  if (i < s.k) return refuse(absl::StrCat("the index list ends after ", i, " indices"));
  return absl::OkStatus();
}

// The value codec's block data of chunk j (values at p) checked (a table in order).
absl::Status CheckValues(const CodecTraits& t, const Shape& s, const uint8_t* p, size_t j) {
  const absl::Status ok = CheckBlocks(t, ValueBlock(t, s.k), p, s.k, 0, s.k);
  if (ok.ok()) return ok;
  return absl::InvalidArgumentError(absl::StrCat("sparse chunk ", j, "'s values: ", ok.message()));
}

// The largest magnitude of x[0, len), as bits.
uint32_t AmaxOf(const float* x, uint32_t len) {
  if (simd::Enabled()) return simd::BlockAmaxBits(x, len);
  uint32_t amax = 0;
  for (uint32_t j = 0; j < len; ++j) amax = std::max(amax, AbsBits(x[j]));
  return amax;
}

// The indices of the elements whose magnitudes' bits are at least `floor`, ascending, into out
// (room for len); the largest magnitude into *amax. When there are at least k of them, the top k
// are among them.
uint32_t AtLeast(const float* x, uint32_t len, uint32_t floor, uint32_t* out, uint32_t* amax) {
  if (simd::Enabled()) return uint32_t(simd::IndicesAtLeast(x, len, floor, out, amax));
  uint32_t m = 0, a = 0;
  for (uint32_t j = 0; j < len; ++j) {  // branch-free: every index written, the passing counted
    const uint32_t b = AbsBits(x[j]);
    a = std::max(a, b);
    out[m] = j;
    m += uint32_t(b >= floor);
  }
  *amax = a;
  return m;
}

// A floor guessed from every (len / 256)-th element: the sample's r-th largest magnitude, r
// about two standard deviations above the number of the top k the sample holds on average (k / s
// of them), so that at least k elements are at or above it in all but a few percent of chunks
// (about 16 r are). Chunks too short for a sample get none (0: everything passes).
uint32_t SampledFloor(const float* x, uint32_t len, uint32_t k) {
  constexpr uint32_t kSample = 256, kMaxRank = 64;
  if (len < 4 * kSample) return 0;
  const uint32_t stride = len / kSample;
  const double mean = double(k) / stride;
  const uint32_t r = uint32_t(std::ceil(mean + 2.2 * std::sqrt(mean))) + 1;
  if (r > kMaxRank) return 0;
  // The r largest of the sample, in descending order (most elements are below the r-th: one
  // comparison each).
  uint32_t top[kMaxRank + 1] = {};
  for (uint32_t i = 0; i < kSample; ++i) {
    const uint32_t v = AbsBits(x[size_t(i) * stride]);
    if (v <= top[r - 1]) continue;
    uint32_t j = r - 1;
    for (; j > 0 && top[j - 1] < v; --j) top[j] = top[j - 1];
    top[j] = v;
  }
  return top[r - 1];
}

// The exact floor when the sample's was too high: the lower edge of the histogram bin (top 10
// magnitude bits: exponent and 2 mantissa bits) that holds the k-th largest. Two interleaved
// histograms, so that neighbours in one bin do not wait on each other.
uint32_t HistogramFloor(const float* x, uint32_t len, uint32_t k, uint32_t amax) {
  constexpr int kShift = 21;
  uint32_t hist[2][1024] = {};
  uint32_t i = 0;
  for (; i + 2 <= len; i += 2) {
    ++hist[0][AbsBits(x[i]) >> kShift];
    ++hist[1][AbsBits(x[i + 1]) >> kShift];
  }
  if (i < len) ++hist[0][AbsBits(x[i]) >> kShift];
  uint32_t above = 0, bin = amax >> kShift;
  for (;; --bin) {
    above += hist[0][bin] + hist[1][bin];
    if (above >= k) break;
  }
  return bin << kShift;
}

}  // namespace

uint32_t SelectTopK(const float* x, uint32_t len, uint32_t k, uint32_t* idx) {
  if (k >= len || k == 0) {
    if (k >= len) std::iota(idx, idx + len, 0u);
    return AmaxOf(x, len);
  }
  // Candidates: everything at or above a floor guessed from a sample (one vector pass), or, when
  // fewer than k pass it, at or above the exact floor of a histogram (a second pass).
  Scratch& scratch = ThreadScratch();
  if (scratch.keys.size() < len) scratch.keys.resize(len);
  if (scratch.passing.size() < len) scratch.passing.resize(len);
  uint32_t* passing = scratch.passing.data();
  uint32_t amax = 0;
  uint32_t m = AtLeast(x, len, SampledFloor(x, len, k), passing, &amax);
  if (amax >= 0x7F800000u) return amax;
  if (m < k) m = AtLeast(x, len, HistogramFloor(x, len, k, amax), passing, &amax);
  // Order by magnitude, ties to the lower index: one 64-bit key per candidate, all distinct. The
  // k-th largest key is the last one kept; the candidates are in index order, and so are the kept.
  auto key = [x](uint32_t j) { return uint64_t(AbsBits(x[j])) << 32 | uint64_t(~j); };
  uint64_t* keys = scratch.keys.data();
  for (uint32_t j = 0; j < m; ++j) keys[j] = key(passing[j]);
  std::nth_element(keys, keys + (k - 1), keys + m, std::greater<uint64_t>());
  const uint64_t last = keys[k - 1];
  for (uint32_t j = 0, kept = 0; kept < k; ++j) {  // branch-free; all k found by the last write
    idx[kept] = passing[j];
    kept += uint32_t(key(passing[j]) >= last);
  }
  return amax;
}

size_t ChunkBytes(const CodecSpec& spec, size_t len) {
  return Chunks::Bytes(Chunks(spec).Of(len));
}

size_t EncodedBytes(const CodecSpec& spec, size_t n) {
  const size_t c = spec.block_size, full = n / c, rest = n % c;
  return full * ChunkBytes(spec, c) + (rest ? ChunkBytes(spec, rest) : 0);
}

uint32_t Encode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                const Rounding& rounding) {
  const Chunks chunks(spec);
  const size_t c = spec.block_size;
  uint32_t amax = 0;
  for (size_t first = 0; first < n; first += c) {
    const uint32_t len = uint32_t(std::min(c, n - first));
    // Each chunk's kept values draw from the indices of the chunk's first elements: the same
    // draws however the payload is cut (on the chunk grid).
    Rounding r = rounding;
    r.first_index = rounding.first_index + first;
    const Shape s = chunks.Of(len);
    amax = std::max(amax, EncodeChunk(chunks.traits, s, in + first, len, out, r));
    if (amax >= 0x7F800000u) return amax;
    out += Chunks::Bytes(s);
  }
  return amax;
}

absl::Status DecodeSlice(const CodecSpec& spec, const uint8_t* in, size_t n, size_t first,
                         size_t last, float* out) {
  const Chunks chunks(spec);
  const CodecTraits& t = chunks.traits;
  const size_t c = spec.block_size, full_bytes = Chunks::Bytes(chunks.full);
  Scratch& scratch = ThreadScratch();
  scratch.idx.resize(c);
  scratch.values.resize(c);
  std::fill(out, out + (last - first), 0.0f);
  for (size_t j = first / c; j * c < last; ++j) {
    const size_t start = j * c, len = std::min(c, n - start);
    const Shape s = chunks.Of(len);
    const uint8_t* p = in + j * full_bytes;
    const absl::Status read = ReadIndices(p + s.value_bytes, s, len, j, scratch.idx.data());
    if (!read.ok()) return read;
    ATL_RETURN_IF_ERROR(CheckValues(t, s, p, j));
    t.decode(ValueBlock(t, s.k), p, s.k, 0, s.k, scratch.values.data());
    const size_t a = std::max(first, start), b = std::min(last, start + len);
    for (uint32_t i = 0; i < s.k; ++i) {
      const size_t g = start + scratch.idx[i];
      if (g >= a && g < b) out[g - first] = scratch.values[i];
    }
  }
  return absl::OkStatus();
}

absl::Status VisitKept(const CodecSpec& spec, const uint8_t* in, size_t n, size_t first,
                       size_t last, const KeptVisitor& visit) {
  const Chunks chunks(spec);
  const CodecTraits& t = chunks.traits;
  const size_t c = spec.block_size, full_bytes = Chunks::Bytes(chunks.full);
  Scratch& scratch = ThreadScratch();
  scratch.idx.resize(c);
  scratch.values.resize(c);
  const uint32_t* idx = scratch.idx.data();
  const float* values = scratch.values.data();
  for (size_t j = first / c; j * c < last; ++j) {
    const size_t start = j * c, len = std::min(c, n - start);
    const Shape s = chunks.Of(len);
    const uint8_t* p = in + j * full_bytes;
    ATL_RETURN_IF_ERROR(ReadIndices(p + s.value_bytes, s, len, j, scratch.idx.data()));
    ATL_RETURN_IF_ERROR(CheckValues(t, s, p, j));
    t.decode(ValueBlock(t, s.k), p, s.k, 0, s.k, scratch.values.data());
    // The kept elements inside [first, last): all of them but in a chunk the range cuts.
    size_t lo = 0, hi = s.k;
    if (start < first) lo = size_t(std::lower_bound(idx, idx + s.k, uint32_t(first - start)) - idx);
    if (start + len > last) hi = size_t(std::lower_bound(idx, idx + s.k, uint32_t(last - start)) - idx);
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(values[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("payload decodes to a non-finite value at element ", start + idx[i]));
      }
    }
    if (hi > lo) visit(start, idx + lo, values + lo, hi - lo);
  }
  return absl::OkStatus();
}

uint32_t EncodeNonzeros(const CodecSpec& spec, size_t n, const uint32_t* index, const float* value,
                        size_t m, uint8_t* out, const Rounding& rounding,
                        const KeptVisitor* decoded) {
  const Chunks chunks(spec);
  const CodecTraits& t = chunks.traits;
  const size_t c = spec.block_size;
  uint32_t amax = 0;
  std::vector<float> dense;
  size_t i = 0;
  for (size_t first = 0; first < n; first += c) {
    const uint32_t len = uint32_t(std::min(c, n - first));
    Rounding r = rounding;
    r.first_index = rounding.first_index + first;
    const Shape s = chunks.Of(len);
    const size_t begin = i;
    i = size_t(std::lower_bound(index + i, index + m, uint32_t(first + len)) - index);
    amax = std::max(amax, AmaxOf(value + begin, uint32_t(i - begin)));
    if (amax >= 0x7F800000u) return amax;
    const uint32_t* at = index + begin;
    const float* held = value + begin;
    const size_t count = i - begin;
    const uint32_t base = uint32_t(first);
    if (!EncodeChunkFromEntries(t, s, len, at, base, held, uint32_t(count), out, r)) {
      dense.assign(len, 0.0f);  // more nonzeros than kept: the selection decides
      for (size_t j = 0; j < count; ++j) dense[at[j] - base] = held[j];
      amax = std::max(amax, EncodeChunk(t, s, dense.data(), len, out, r));
    }
    if (decoded != nullptr && amax < 0x7F800000u) {
      // The chunk's kept indices are in the scratch still; their values as decoding reads them.
      Scratch& scratch = ThreadScratch();
      t.decode(ValueBlock(t, s.k), out, s.k, 0, s.k, scratch.values.data());
      (*decoded)(first, scratch.idx.data(), scratch.values.data(), s.k);
    }
    out += Chunks::Bytes(s);
  }
  return amax;
}

ValueLayout ValueLayoutOf(const CodecTraits& t) {
  return {t.default_block != 0, t.block_bytes, t.element_bits};
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
