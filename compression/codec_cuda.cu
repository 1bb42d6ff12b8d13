// CUDA kernels of the codecs. The arithmetic is codec_math.h's, shared with the CPU codecs, and
// this file is compiled with -fmad=false, so the output is bit-identical to compression::Encode.
//
// Block codecs (int8, fp4, int2): one warp per scale block. The lanes stride through the block,
// reduce the largest magnitude with shuffles, and then each lane writes whole bytes (a pair of
// 4-bit codes, four 2-bit codes, or one int8), so writes never race. Element-wise codecs use one
// thread per element. The sparse codecs' kernels are in codec_cuda_sparse.cu.
#include <cuda_runtime.h>

#include <algorithm>

#include "compression/codec_spec.h"
#include "compression/codec_cuda_launch.h"
#include "compression/codec_cuda_min.cuh"
#include "compression/codec_math.h"

namespace atl::compression::cuda::detail {
namespace {

namespace m = ::atl::compression::math;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

unsigned GridFor(size_t work_items, size_t items_per_block) {
  const size_t blocks = (work_items + items_per_block - 1) / items_per_block;
  return unsigned(std::max<size_t>(1, std::min<size_t>(blocks, 65535)));
}

__device__ size_t GlobalThread() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t GridThreads() { return size_t(gridDim.x) * blockDim.x; }

// Largest magnitude of block [first, first + len), reduced over the warp (all lanes get it).
__device__ float WarpBlockAmax(const float* in, size_t first, size_t len, int lane) {
  uint32_t mx = 0;
  for (size_t i = lane; i < len; i += 32) mx = max(mx, m::AbsBits(in[first + i]));
  for (int off = 16; off > 0; off >>= 1) mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
  return m::FromBits(mx);
}

__global__ void FirstNonFiniteKernel(const float* in, size_t n, unsigned long long* first) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    if (!m::IsFinite(in[i])) atomicMin(first, (unsigned long long)i);
  }
}

template <class F, bool kStochastic>
__device__ uint8_t Fp4Code(float x, float inv, int max_code, uint64_t seed, uint64_t index) {
  if constexpr (kStochastic) {
    return m::Fp4Stochastic<F>(x, inv, m::Uniform(seed, index), max_code);
  } else {
    return m::Fp4Nearest<F>(x, inv, max_code);
  }
}

template <class F, bool kStochastic>
__global__ void EncodeFp4Kernel(const float* in, size_t n, uint32_t block, size_t nblocks,
                                uint8_t* out, uint64_t seed, uint64_t first_index) {
  const int lane = threadIdx.x & 31;
  uint8_t* codes = out + nblocks;
  for (size_t b = GlobalThread() / 32; b < nblocks; b += GridThreads() / 32) {
    const size_t first = b * block, len = min(size_t(block), n - first);
    const int e = m::Fp4ScaleExponent<F>(WarpBlockAmax(in, first, len, lane));
    if (lane == 0) out[b] = uint8_t(e + 127);
    const float inv = m::Pow2(-e);
    const int max_code = F::MaxCode(e);
    for (size_t p = lane; p < (len + 1) / 2; p += 32) {
      const size_t k = first + 2 * p;
      const uint8_t lo = Fp4Code<F, kStochastic>(in[k], inv, max_code, seed, first_index + k);
      const uint8_t hi = 2 * p + 1 < len ? Fp4Code<F, kStochastic>(in[k + 1], inv, max_code, seed,
                                                                     first_index + k + 1)
                                         : 0;
      codes[k / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

template <bool kStochastic>
__global__ void EncodeInt8Kernel(const float* in, size_t n, uint32_t block, size_t nblocks,
                                 uint8_t* out, uint64_t seed, uint64_t first_index) {
  const int lane = threadIdx.x & 31;
  int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nblocks);
  for (size_t b = GlobalThread() / 32; b < nblocks; b += GridThreads() / 32) {
    const size_t first = b * block, len = min(size_t(block), n - first);
    const float scale = m::Int8Scale(WarpBlockAmax(in, first, len, lane));
    if (lane < 4) out[4 * b + lane] = uint8_t(m::Bits(scale) >> (8 * lane));  // little-endian
    for (size_t i = lane; i < len; i += 32) {
      const size_t k = first + i;
      if constexpr (kStochastic) {
        q[k] = m::Int8Stochastic(in[k], scale, m::Uniform(seed, first_index + k));
      } else {
        q[k] = m::Int8Nearest(in[k], scale);
      }
    }
  }
}

template <bool kStochastic>
__device__ uint8_t Int2Code(float x, float q, uint64_t seed, uint64_t index) {
  if constexpr (kStochastic) {
    return m::Int2Stochastic(x, q, m::Uniform(seed, index));
  } else {
    return m::Int2Nearest(x, q);
  }
}

// Blocks are multiples of 4 elements, so each block's codes start on a byte.
template <bool kStochastic>
__global__ void EncodeInt2Kernel(const float* in, size_t n, uint32_t block, size_t nblocks,
                                 uint8_t* out, uint64_t seed, uint64_t first_index) {
  const int lane = threadIdx.x & 31;
  uint8_t* codes = out + 4 * nblocks;
  for (size_t b = GlobalThread() / 32; b < nblocks; b += GridThreads() / 32) {
    const size_t first = b * block, len = min(size_t(block), n - first);
    const float q = m::Int2Step(WarpBlockAmax(in, first, len, lane));
    if (lane < 4) out[4 * b + lane] = uint8_t(m::Bits(q) >> (8 * lane));  // little-endian
    for (size_t p = lane; p < (len + 3) / 4; p += 32) {
      uint32_t byte = 0;
      for (size_t j = 4 * p; j < min(4 * p + 4, len); ++j) {
        const size_t k = first + j;
        byte |= uint32_t(Int2Code<kStochastic>(in[k], q, seed, first_index + k)) << (2 * (j & 3));
      }
      codes[first / 4 + p] = uint8_t(byte);
    }
  }
}

__global__ void DecodeInt2Kernel(const uint8_t* in, size_t n, uint32_t block, size_t nblocks,
                                 float* out) {
  const uint8_t* codes = in + 4 * nblocks;
  for (size_t k = GlobalThread(); k < n; k += GridThreads()) {
    const uint8_t* s = in + 4 * (k / block);
    const float q =
        m::FromBits(uint32_t(s[0]) | uint32_t(s[1]) << 8 | uint32_t(s[2]) << 16 | uint32_t(s[3]) << 24);
    out[k] = m::Int2Value(uint8_t(codes[k / 4] >> (2 * (k & 3))), q);
  }
}

__global__ void EncodeBf16Kernel(const float* in, size_t n, uint8_t* out, bool stochastic,
                                 uint64_t seed, uint64_t first_index) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const uint16_t h = stochastic ? m::Bf16Stochastic(in[i], seed, first_index + i)
                                  : m::Bf16Nearest(in[i]);
    out[2 * i] = uint8_t(h);
    out[2 * i + 1] = uint8_t(h >> 8);
  }
}

template <class F>
__global__ void DecodeFp4Kernel(const uint8_t* in, size_t n, uint32_t block, size_t nblocks,
                                float* out) {
  const uint8_t* codes = in + nblocks;
  for (size_t k = GlobalThread(); k < n; k += GridThreads()) {
    const float scale = m::Pow2(int(in[k / block]) - 127);
    out[k] = m::Fp4Value<F>(uint8_t((codes[k / 2] >> ((k & 1) * 4)) & 0xF), scale);
  }
}

__global__ void DecodeInt8Kernel(const uint8_t* in, size_t n, uint32_t block, size_t nblocks,
                                 float* out) {
  const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nblocks);
  for (size_t k = GlobalThread(); k < n; k += GridThreads()) {
    const uint8_t* s = in + 4 * (k / block);
    const float scale =
        m::FromBits(uint32_t(s[0]) | uint32_t(s[1]) << 8 | uint32_t(s[2]) << 16 | uint32_t(s[3]) << 24);
    out[k] = float(q[k]) * scale;
  }
}

__global__ void DecodeBf16Kernel(const uint8_t* in, size_t n, float* out) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = m::Bf16Value(uint16_t(in[2 * i] | (in[2 * i + 1] << 8)));
  }
}

__global__ void SubtractKernel(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = a[i] - b[i];
}

template <class F>
void LaunchFp4(bool stochastic, const float* in, size_t n, uint32_t block, size_t nblocks,
               uint8_t* out, uint64_t seed, uint64_t first_index, cudaStream_t s) {
  const unsigned grid = GridFor(nblocks, kWarpsPerBlock);
  if (stochastic) {
    EncodeFp4Kernel<F, true><<<grid, kThreads, 0, s>>>(in, n, block, nblocks, out, seed, first_index);
  } else {
    EncodeFp4Kernel<F, false><<<grid, kThreads, 0, s>>>(in, n, block, nblocks, out, seed, first_index);
  }
}

}  // namespace

int FirstNonFinite(const float* in, size_t n, size_t* first, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return DeviceMin(s, n, first, [&](unsigned long long* d_first) {
    if (n > 0) FirstNonFiniteKernel<<<GridFor(n, kThreads), kThreads, 0, s>>>(in, n, d_first);
    return int(cudaGetLastError());
  });
}

namespace {

// One codec's kernels, launched on stream s (the spec is valid, n > 0); asynchronous.
struct Launch {
  uint32_t block;
  size_t n, nblocks;
  cudaStream_t s;
};

int EncodeFp32(const Launch& l, const float* in, uint8_t* out, const Rounding&) {
  return int(cudaMemcpyAsync(out, in, l.n * 4, cudaMemcpyDeviceToDevice, l.s));
}
int DecodeFp32(const Launch& l, const uint8_t* in, float* out) {
  return int(cudaMemcpyAsync(out, in, l.n * 4, cudaMemcpyDeviceToDevice, l.s));
}

int EncodeBf16(const Launch& l, const float* in, uint8_t* out, const Rounding& r) {
  EncodeBf16Kernel<<<GridFor(l.n, kThreads), kThreads, 0, l.s>>>(in, l.n, out, r.stochastic,
                                                                   r.seed, r.first_index);
  return int(cudaGetLastError());
}
int DecodeBf16(const Launch& l, const uint8_t* in, float* out) {
  DecodeBf16Kernel<<<GridFor(l.n, kThreads), kThreads, 0, l.s>>>(in, l.n, out);
  return int(cudaGetLastError());
}

int EncodeInt8(const Launch& l, const float* in, uint8_t* out, const Rounding& r) {
  const unsigned grid = GridFor(l.nblocks, kWarpsPerBlock);
  if (r.stochastic) {
    EncodeInt8Kernel<true><<<grid, kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks, out, r.seed,
                                                       r.first_index);
  } else {
    EncodeInt8Kernel<false><<<grid, kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks, out, r.seed,
                                                        r.first_index);
  }
  return int(cudaGetLastError());
}
int DecodeInt8(const Launch& l, const uint8_t* in, float* out) {
  DecodeInt8Kernel<<<GridFor(l.n, kThreads), kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks,
                                                                  out);
  return int(cudaGetLastError());
}

int EncodeInt2(const Launch& l, const float* in, uint8_t* out, const Rounding& r) {
  const unsigned grid = GridFor(l.nblocks, kWarpsPerBlock);
  if (r.stochastic) {
    EncodeInt2Kernel<true><<<grid, kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks, out, r.seed,
                                                       r.first_index);
  } else {
    EncodeInt2Kernel<false><<<grid, kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks, out, r.seed,
                                                        r.first_index);
  }
  return int(cudaGetLastError());
}
int DecodeInt2(const Launch& l, const uint8_t* in, float* out) {
  DecodeInt2Kernel<<<GridFor(l.n, kThreads), kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks,
                                                                  out);
  return int(cudaGetLastError());
}

template <class F>
int EncodeFp4(const Launch& l, const float* in, uint8_t* out, const Rounding& r) {
  LaunchFp4<F>(r.stochastic, in, l.n, l.block, l.nblocks, out, r.seed, r.first_index, l.s);
  return int(cudaGetLastError());
}
template <class F>
int DecodeFp4(const Launch& l, const uint8_t* in, float* out) {
  DecodeFp4Kernel<F><<<GridFor(l.n, kThreads), kThreads, 0, l.s>>>(in, l.n, l.block, l.nblocks,
                                                                    out);
  return int(cudaGetLastError());
}

// The codecs with kernels (their rows of codec_traits.h say cuda = true).
struct Kernels {
  Codec codec;
  int (*encode)(const Launch&, const float*, uint8_t*, const Rounding&);
  int (*decode)(const Launch&, const uint8_t*, float*);
};
constexpr Kernels kKernels[] = {
    {Codec::kFp32, EncodeFp32, DecodeFp32},
    {Codec::kBf16, EncodeBf16, DecodeBf16},
    {Codec::kInt8, EncodeInt8, DecodeInt8},
    {Codec::kFp4E2M1, EncodeFp4<m::E2M1>, DecodeFp4<m::E2M1>},
    {Codec::kFp4E3M0, EncodeFp4<m::E3M0>, DecodeFp4<m::E3M0>},
    {Codec::kInt2, EncodeInt2, DecodeInt2},
};

const Kernels* KernelsOf(Codec codec) {
  for (const Kernels& k : kKernels) {
    if (k.codec == codec) return &k;
  }
  return nullptr;
}

Launch LaunchOf(const CodecSpec& spec, size_t n, void* stream) {
  const uint32_t block = spec.block_size;
  return {block, n, block ? (n + block - 1) / block : 0, static_cast<cudaStream_t>(stream)};
}

}  // namespace

bool HasKernels(Codec codec) { return KernelsOf(codec) != nullptr; }

int LaunchEncode(const CodecSpec& spec, const float* in, size_t n, uint8_t* out,
                 const Rounding& rounding, void* stream) {
  const Kernels* k = KernelsOf(spec.codec);
  if (k == nullptr) return int(cudaErrorNotSupported);
  if (n == 0) return int(cudaSuccess);
  return k->encode(LaunchOf(spec, n, stream), in, out, rounding);
}

int LaunchDecode(const CodecSpec& spec, const uint8_t* in, size_t n, float* out, void* stream) {
  const Kernels* k = KernelsOf(spec.codec);
  if (k == nullptr) return int(cudaErrorNotSupported);
  if (n == 0) return int(cudaSuccess);
  return k->decode(LaunchOf(spec, n, stream), in, out);
}

int LaunchSubtract(const float* a, const float* b, float* out, size_t n, void* stream) {
  if (n == 0) return int(cudaSuccess);
  SubtractKernel<<<GridFor(n, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, b, out, n);
  return int(cudaGetLastError());
}

}  // namespace atl::compression::cuda::detail
