// CUDA kernels of the sparse codecs (compression/codec_sparse.h has the layout): the same bytes as
// sparse::Encode, bit for bit (the value arithmetic is codec_math.h's, the chunk shape
// sparse_shape.h's, and the file is compiled with -fmad=false like codec_cuda.cu).
//
// One thread block per chunk (at most 4096 elements, held in shared memory):
//   encode: the magnitudes' bits; the k-th largest of them by a radix select, 8 bits a pass from
//     the top; the kept indices compacted in index order (ties to the lower index, through a scan
//     of the tied ones), their values encoded as one block of the value codec, each thread writing
//     whole bytes; the Elias-Fano bits set with atomicOr in shared words, then copied out.
//   decode: the index list read and checked (exactly k set bits in the unary part, every index in
//     the chunk, strictly ascending) before the chunk's elements are written; a refused chunk is
//     reported, and the caller names the problem with the CPU decoder's words.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "compression/codec_cuda_launch.h"
#include "compression/codec_cuda_min.cuh"
#include "compression/codec_math.h"
#include "compression/codec_spec.h"
#include "compression/sparse_shape.h"

namespace atl::compression::cuda::detail {
namespace {

namespace m = ::atl::compression::math;
using sparse::kMaxChunk;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// The index bits of a chunk are at most 2 x 4096 + 1 (k = L: no low bits, 2L unary bits).
constexpr uint32_t kIndexWords = (2 * kMaxChunk + 1 + 31) / 32;

// What every chunk of one payload shares.
struct Chunks {
  uint32_t chunk, topk;
  size_t n, count, full_bytes;  // elements, chunks, bytes of a full chunk
  sparse::ValueLayout values;
};

// ---- Block-wide helpers (every thread of the block calls them).

__device__ uint32_t BlockMax(uint32_t v) {
  __shared__ uint32_t warp_max[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  uint32_t all = 0;
  for (int w = 0; w < kWarps; ++w) all = max(all, warp_max[w]);
  __syncthreads();
  return all;
}

// The sum of v over the threads before this one; *total = the sum over all.
__device__ uint32_t BlockExclusiveSum(uint32_t v, uint32_t* total) {
  __shared__ uint32_t warp_sum[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t inclusive = v;
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t u = __shfl_up_sync(0xFFFFFFFFu, inclusive, off);
    if (lane >= off) inclusive += u;
  }
  if (lane == 31) warp_sum[warp] = inclusive;
  __syncthreads();
  uint32_t before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_sum[w];
    all += warp_sum[w];
  }
  __syncthreads();
  *total = all;
  return before + inclusive - v;
}

// ---- The value codecs on one block of k values (their CPU encoders' arithmetic).

__device__ float LoadFloat(const uint8_t* p) {
  return m::FromBits(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                     uint32_t(p[3]) << 24);
}
__device__ void StoreWord(uint8_t* p, uint32_t w, int t) {  // byte t of w, little-endian
  p[t] = uint8_t(w >> (8 * t));
}

// Encodes the k values value(i) into out (header, then codes); draw i is at base + i.
template <Codec C, bool kStochastic, class Value>
__device__ void EncodeValues(Value value, uint32_t k, float amax, uint8_t* out, uint64_t seed,
                             uint64_t base) {
  const uint32_t t = threadIdx.x;
  if constexpr (C == Codec::kInt2) {
    const float q = m::Int2Step(amax);
    if (t < 4) StoreWord(out, m::Bits(q), int(t));
    for (uint32_t p = t; p < (k + 3) / 4; p += kThreads) {
      uint32_t byte = 0;
      for (uint32_t i = 4 * p; i < min(4 * p + 4, k); ++i) {
        const float x = value(i);
        const uint8_t c = kStochastic ? m::Int2Stochastic(x, q, m::Uniform(seed, base + i))
                                      : m::Int2Nearest(x, q);
        byte |= uint32_t(c) << (2 * (i & 3));
      }
      out[4 + p] = uint8_t(byte);
    }
  } else if constexpr (C == Codec::kFp4E2M1 || C == Codec::kFp4E3M0) {
    using F = std::conditional_t<C == Codec::kFp4E2M1, m::E2M1, m::E3M0>;
    const int e = m::Fp4ScaleExponent<F>(amax);
    if (t == 0) out[0] = uint8_t(e + 127);
    const float inv = m::Pow2(-e);
    const int max_code = F::MaxCode(e);
    for (uint32_t p = t; p < (k + 1) / 2; p += kThreads) {
      uint32_t byte = 0;
      for (uint32_t i = 2 * p; i < min(2 * p + 2, k); ++i) {
        const float x = value(i);
        const uint8_t c = kStochastic
                              ? m::Fp4Stochastic<F>(x, inv, m::Uniform(seed, base + i), max_code)
                              : m::Fp4Nearest<F>(x, inv, max_code);
        byte |= uint32_t(c) << (4 * (i & 1));
      }
      out[1 + p] = uint8_t(byte);
    }
  } else if constexpr (C == Codec::kInt8) {
    const float scale = m::Int8Scale(amax);
    if (t < 4) StoreWord(out, m::Bits(scale), int(t));
    for (uint32_t i = t; i < k; i += kThreads) {
      const float x = value(i);
      const int8_t q = kStochastic ? m::Int8Stochastic(x, scale, m::Uniform(seed, base + i))
                                   : m::Int8Nearest(x, scale);
      out[4 + i] = uint8_t(q);
    }
  } else if constexpr (C == Codec::kBf16) {
    for (uint32_t i = t; i < k; i += kThreads) {
      const float x = value(i);
      const uint16_t h = kStochastic ? m::Bf16Stochastic(x, seed, base + i) : m::Bf16Nearest(x);
      out[2 * i] = uint8_t(h);
      out[2 * i + 1] = uint8_t(h >> 8);
    }
  } else {
    static_assert(C == Codec::kFp32, "a value codec without sparse kernels");
    for (uint32_t i = t; i < k; i += kThreads) {
      const uint32_t w = m::Bits(value(i));
      for (int b = 0; b < 4; ++b) StoreWord(out + 4 * i, w, b);
    }
  }
}

// The i-th of the k values of a block encoded by EncodeValues.
template <Codec C>
__device__ float DecodeValue(const uint8_t* in, uint32_t i) {
  if constexpr (C == Codec::kInt2) {
    return m::Int2Value(uint8_t(in[4 + i / 4] >> (2 * (i & 3))), LoadFloat(in));
  } else if constexpr (C == Codec::kFp4E2M1 || C == Codec::kFp4E3M0) {
    using F = std::conditional_t<C == Codec::kFp4E2M1, m::E2M1, m::E3M0>;
    const float scale = m::Pow2(int(in[0]) - 127);
    return m::Fp4Value<F>(uint8_t((in[1 + i / 2] >> (4 * (i & 1))) & 0xF), scale);
  } else if constexpr (C == Codec::kInt8) {
    return float(int8_t(in[4 + i])) * LoadFloat(in);
  } else if constexpr (C == Codec::kBf16) {
    return m::Bf16Value(uint16_t(in[2 * i] | (in[2 * i + 1] << 8)));
  } else {
    return LoadFloat(in + 4 * i);
  }
}

__device__ uint32_t Bit(const uint8_t* bits, size_t pos) { return (bits[pos >> 3] >> (pos & 7)) & 1u; }

__device__ uint32_t GetBits(const uint8_t* bits, size_t pos, uint32_t nbits) {
  uint32_t v = 0;
  for (uint32_t j = 0; j < nbits; ++j) v |= Bit(bits, pos + j) << j;
  return v;
}

// ---- Encode: one chunk per block.

// The k-th largest of mag[0, len) (T) and how many of the elements equal to T are kept (the
// first ones): 4 passes of an 8-bit histogram over the elements that match T's bits so far.
__device__ void SelectThreshold(const uint32_t* mag, uint32_t len, uint32_t k, uint32_t* threshold,
                                uint32_t* ties) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t chosen[2];
  uint32_t prefix = 0, need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    const uint32_t known = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (uint32_t i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < len; i += kThreads) {
      if ((mag[i] & known) == prefix) atomicAdd(&hist[(mag[i] >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t above = 0, b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= need) break;
        above += hist[b];
      }
      chosen[0] = prefix | (b << shift);
      chosen[1] = need - above;
    }
    __syncthreads();
    prefix = chosen[0];
    need = chosen[1];
    __syncthreads();
  }
  *threshold = prefix;
  *ties = need;
}

// The kept indices of mag[0, len), ascending, into kept[k]: every magnitude above T, and the
// first `ties` equal to it. Each thread takes a run of consecutive elements, so a scan of the
// per-thread counts orders them.
__device__ void CompactKept(const uint32_t* mag, uint32_t len, uint32_t threshold, uint32_t ties,
                            uint16_t* kept) {
  const uint32_t run = (len + kThreads - 1) / kThreads;
  const uint32_t lo = min(len, threadIdx.x * run), hi = min(len, lo + run);
  uint32_t equal = 0;
  for (uint32_t i = lo; i < hi; ++i) equal += uint32_t(mag[i] == threshold);
  uint32_t total = 0;
  const uint32_t equal_before = BlockExclusiveSum(equal, &total);
  uint32_t keep = 0;
  for (uint32_t i = lo, r = equal_before; i < hi; ++i) {
    if (mag[i] > threshold) ++keep;
    if (mag[i] == threshold) keep += uint32_t(r++ < ties);
  }
  uint32_t at = BlockExclusiveSum(keep, &total);
  for (uint32_t i = lo, r = equal_before; i < hi; ++i) {
    const bool take = mag[i] > threshold || (mag[i] == threshold && r++ < ties);
    if (take) kept[at++] = uint16_t(i);
  }
  __syncthreads();
}

// The Elias-Fano bits of kept[k] (sparse::Shape s) into out[s.index_bytes].
__device__ void EncodeIndices(const uint16_t* kept, const sparse::Shape& s, uint8_t* out) {
  __shared__ uint32_t words[kIndexWords];
  const uint32_t nwords = uint32_t((s.index_bytes + 3) / 4);
  for (uint32_t i = threadIdx.x; i < nwords; i += kThreads) words[i] = 0;
  __syncthreads();
  const size_t upper = size_t(s.k) * s.l;
  const uint32_t low_mask = (1u << s.l) - 1;
  for (uint32_t i = threadIdx.x; i < s.k; i += kThreads) {
    const uint32_t index = kept[i];
    if (s.l > 0) {
      const size_t pos = size_t(i) * s.l;
      const uint32_t v = index & low_mask, off = uint32_t(pos & 31);
      atomicOr(&words[pos >> 5], v << off);
      if (off + s.l > 32) atomicOr(&words[(pos >> 5) + 1], v >> (32 - off));
    }
    const size_t p = upper + (index >> s.l) + i;
    atomicOr(&words[p >> 5], 1u << (p & 31));
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < s.index_bytes; i += kThreads) {
    out[i] = uint8_t(words[i >> 2] >> (8 * (i & 3)));
  }
  __syncthreads();
}

template <Codec C, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    EncodeSparseKernel(const float* in, Chunks c, uint8_t* out, uint64_t seed, uint64_t first_index) {
  __shared__ uint32_t mag[kMaxChunk];
  __shared__ uint16_t kept[kMaxChunk];
  for (size_t chunk = blockIdx.x; chunk < c.count; chunk += gridDim.x) {
    const size_t first = chunk * c.chunk;
    const uint32_t len = uint32_t(min(size_t(c.chunk), c.n - first));
    const sparse::Shape s = sparse::ShapeOf(c.topk, len, c.values);
    const float* x = in + first;
    uint32_t amax = 0;
    for (uint32_t i = threadIdx.x; i < len; i += kThreads) {
      mag[i] = m::AbsBits(x[i]);
      amax = max(amax, mag[i]);
    }
    amax = BlockMax(amax);  // synchronizes: mag is complete
    uint32_t threshold = 0, ties = len;  // k = len: everything is kept
    if (s.k < len) SelectThreshold(mag, len, s.k, &threshold, &ties);
    CompactKept(mag, len, threshold, ties, kept);
    uint8_t* dst = out + chunk * c.full_bytes;
    // The kept values draw at the chunk's first index plus their rank, as on the CPU.
    EncodeValues<C, kStochastic>([&](uint32_t i) { return x[kept[i]]; }, s.k, m::FromBits(amax),
                                 dst, seed, first_index + first);
    EncodeIndices(kept, s, dst + s.value_bytes);
  }
}

// ---- Decode: one chunk per block.

template <Codec C>
__global__ void __launch_bounds__(kThreads)
    DecodeSparseKernel(const uint8_t* in, Chunks c, float* out, unsigned long long* bad_chunk) {
  __shared__ uint16_t index[kMaxChunk];
  __shared__ uint8_t bits[kIndexWords * 4];
  for (size_t chunk = blockIdx.x; chunk < c.count; chunk += gridDim.x) {
    const size_t first = chunk * c.chunk;
    const uint32_t len = uint32_t(min(size_t(c.chunk), c.n - first));
    const sparse::Shape s = sparse::ShapeOf(c.topk, len, c.values);
    const uint8_t* src = in + chunk * c.full_bytes;
    __syncthreads();  // the previous chunk is done with the shared memory
    for (uint32_t i = threadIdx.x; i < s.index_bytes; i += kThreads) bits[i] = src[s.value_bytes + i];
    __syncthreads();
    // The unary high parts: each thread counts the set bits of its run, a scan ranks them.
    const size_t upper = size_t(s.k) * s.l;
    const uint32_t span = uint32_t(s.upper_bits), run = (span + kThreads - 1) / kThreads;
    const uint32_t lo = min(span, threadIdx.x * run), hi = min(span, lo + run);
    uint32_t set = 0;
    for (uint32_t b = lo; b < hi; ++b) set += Bit(bits, upper + b);
    uint32_t total = 0;
    uint32_t rank = BlockExclusiveSum(set, &total);
    if (total != s.k) {  // the list ends early or holds more than kept: the same for every thread
      if (threadIdx.x == 0) atomicMin(bad_chunk, (unsigned long long)chunk);
      continue;
    }
    int bad = 0;  // this thread's verdict; the block's is their OR
    for (uint32_t b = lo; b < hi; ++b) {
      if (!Bit(bits, upper + b)) continue;
      const uint32_t i = rank++;
      const uint32_t value = ((b - i) << s.l) | GetBits(bits, size_t(i) * s.l, s.l);
      bad |= int(value >= len);
      index[i] = uint16_t(min(value, len - 1));
    }
    __syncthreads();  // the index list is complete
    for (uint32_t i = threadIdx.x + 1; i < s.k; i += kThreads) bad |= int(index[i] <= index[i - 1]);
    if (__syncthreads_or(bad)) {
      if (threadIdx.x == 0) atomicMin(bad_chunk, (unsigned long long)chunk);
      continue;
    }
    float* dst = out + first;
    for (uint32_t i = threadIdx.x; i < len; i += kThreads) dst[i] = 0.0f;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < s.k; i += kThreads) dst[index[i]] = DecodeValue<C>(src, i);
  }
}

unsigned GridFor(size_t chunks) { return unsigned(std::max<size_t>(1, std::min<size_t>(chunks, 65535))); }

Chunks ChunksOf(const CodecSpec& spec, const sparse::ValueLayout& values, size_t n,
                size_t full_bytes) {
  const size_t count = (n + spec.block_size - 1) / spec.block_size;
  return {spec.block_size, spec.topk, n, count, full_bytes, values};
}

template <Codec C>
int EncodeAs(const Chunks& c, const float* in, uint8_t* out, const Rounding& r, cudaStream_t s) {
  if (r.stochastic) {
    EncodeSparseKernel<C, true><<<GridFor(c.count), kThreads, 0, s>>>(in, c, out, r.seed,
                                                                      r.first_index);
  } else {
    EncodeSparseKernel<C, false><<<GridFor(c.count), kThreads, 0, s>>>(in, c, out, r.seed,
                                                                       r.first_index);
  }
  return int(cudaGetLastError());
}

template <Codec C>
int DecodeAs(const Chunks& c, const uint8_t* in, float* out, unsigned long long* bad,
             cudaStream_t s) {
  DecodeSparseKernel<C><<<GridFor(c.count), kThreads, 0, s>>>(in, c, out, bad);
  return int(cudaGetLastError());
}

// The value codecs with sparse kernels: those with dense ones (codec_cuda.cu's kKernels).
struct SparseKernels {
  Codec codec;
  int (*encode)(const Chunks&, const float*, uint8_t*, const Rounding&, cudaStream_t);
  int (*decode)(const Chunks&, const uint8_t*, float*, unsigned long long*, cudaStream_t);
};
constexpr SparseKernels kSparseKernels[] = {
    {Codec::kFp32, EncodeAs<Codec::kFp32>, DecodeAs<Codec::kFp32>},
    {Codec::kBf16, EncodeAs<Codec::kBf16>, DecodeAs<Codec::kBf16>},
    {Codec::kInt8, EncodeAs<Codec::kInt8>, DecodeAs<Codec::kInt8>},
    {Codec::kFp4E2M1, EncodeAs<Codec::kFp4E2M1>, DecodeAs<Codec::kFp4E2M1>},
    {Codec::kFp4E3M0, EncodeAs<Codec::kFp4E3M0>, DecodeAs<Codec::kFp4E3M0>},
    {Codec::kInt2, EncodeAs<Codec::kInt2>, DecodeAs<Codec::kInt2>},
};

const SparseKernels* SparseKernelsOf(Codec codec) {
  for (const SparseKernels& k : kSparseKernels) {
    if (k.codec == codec) return &k;
  }
  return nullptr;
}

}  // namespace

bool HasSparseKernels(Codec values) { return SparseKernelsOf(values) != nullptr; }

int LaunchSparseEncode(const CodecSpec& spec, const sparse::ValueLayout& values,
                       size_t chunk_bytes, const float* in, size_t n, uint8_t* out,
                       const Rounding& rounding, void* stream) {
  const SparseKernels* k = SparseKernelsOf(spec.codec);
  if (k == nullptr || spec.block_size == 0 || spec.block_size > kMaxChunk) {
    return int(cudaErrorNotSupported);
  }
  if (n == 0) return int(cudaSuccess);
  return k->encode(ChunksOf(spec, values, n, chunk_bytes), in, out, rounding,
                   static_cast<cudaStream_t>(stream));
}

int LaunchSparseDecode(const CodecSpec& spec, const sparse::ValueLayout& values,
                       size_t chunk_bytes, const uint8_t* in, size_t n, float* out,
                       size_t* bad_chunk, void* stream) {
  const SparseKernels* k = SparseKernelsOf(spec.codec);
  *bad_chunk = SIZE_MAX;
  if (k == nullptr || spec.block_size == 0 || spec.block_size > kMaxChunk) {
    return int(cudaErrorNotSupported);
  }
  if (n == 0) return int(cudaSuccess);
  auto s = static_cast<cudaStream_t>(stream);
  return DeviceMin(s, SIZE_MAX, bad_chunk, [&](unsigned long long* d_bad) {
    return k->decode(ChunksOf(spec, values, n, chunk_bytes), in, out, d_bad, s);
  });
}

}  // namespace atl::compression::cuda::detail
