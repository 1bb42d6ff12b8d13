// The one place where atoll bridges libtorch versions. Debian ships libtorch 1.13 (CPU); GPU
// deployments use libtorch 2.x. Everything else calls these helpers instead of testing versions.
#ifndef ATOLL_INNER_TORCH_COMPAT_H_
#define ATOLL_INNER_TORCH_COMPAT_H_

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace c10d {
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace atl::inner::compat {

// The base class of c10d's process groups (Gloo, NCCL), with their collectives: ProcessGroup in
// 1.x, Backend in 2.x (where ProcessGroup became a dispatcher over backends). Complete where a
// process group's header is included.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// c10d::TCPStoreOptions: the libuv server is an option since 2.2 and the default since 2.4, and
// Debian 13's libtorch is built without libuv; the classic server works in every build.
template <typename TcpStoreOptions>
void UseClassicTcpStore(TcpStoreOptions& options) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  options.useLibUV = false;
#else
  (void)options;
#endif
}

inline constexpr bool kHasFusedAttention = TORCH_VERSION_MAJOR >= 2;

// Causal self-attention over [B, heads, T, head_dim] tensors (no dropout on the weights).
inline at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(q.size(-1))));
  auto future = at::ones({t, t}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
#endif
}

// Attention of the last q.size(-2) positions over all k.size(-2) of them (a decoding step over a
// key/value cache): query i sits at position Tk - Tq + i and sees the keys up to it.
inline at::Tensor CachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t tq = q.size(-2), tk = k.size(-2);
  if (tq == tk) return CausalAttention(q, k, v);
  auto scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(q.size(-1))));
  if (tq > 1) {
    auto future = at::ones({tq, tk}, q.options().dtype(at::kBool)).triu(tk - tq + 1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  }
  return at::matmul(at::softmax(scores, -1), v);
}

// While alive: autocast to bf16 on the CPU or CUDA (matrix products in bf16, reductions, norms and
// the loss in fp32; parameters and their gradients stay fp32). The API moved from per-device
// functions (1.x) to functions of the device type (2.4+). Nothing when not enabled.
class AutocastBf16 {
 public:
  AutocastBf16(bool enabled, bool cuda);
  ~AutocastBf16();
  AutocastBf16(const AutocastBf16&) = delete;
  AutocastBf16& operator=(const AutocastBf16&) = delete;

 private:
  bool enabled_, cuda_, was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// While alive: a CUDA operation that makes the host wait for the device (an item(), a blocking
// copy, a stream synchronize) throws, as libtorch's sync debug mode "error" does. Needs a CUDA
// libtorch (ATOLL_TORCH_CUDA); with a CPU-only one nothing ever waits for a device and it does
// nothing (`active()` says which).
class ThrowOnDeviceSync {
 public:
  ThrowOnDeviceSync();
  ~ThrowOnDeviceSync();
  ThrowOnDeviceSync(const ThrowOnDeviceSync&) = delete;
  ThrowOnDeviceSync& operator=(const ThrowOnDeviceSync&) = delete;
  static bool active();

 private:
  int was_ = 0;
};

// A fresh CPU generator seeded with `seed` (the API moved between 1.x and 2.x only in headers).
at::Generator MakeCpuGenerator(uint64_t seed);

// Gives the storage behind `t` (and every view of it) `bytes` bytes of fresh, uninitialized memory
// from its own allocator; 0 frees it. The storage object stays the same, so tensors that autograd
// saved keep pointing at it (FSDP frees a unit's parameters between forward and backward).
void ResizeStorage(const at::Tensor& t, size_t bytes);

// Snapshot / restore of the default CPU generator (dropout draws from it).
at::Tensor GetDefaultCpuRngState();
void SetDefaultCpuRngState(const at::Tensor& state);

}  // namespace atl::inner::compat

#endif  // ATOLL_INNER_TORCH_COMPAT_H_
