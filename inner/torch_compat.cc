#include "inner/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>

namespace atl::inner::compat {

at::Generator MakeCpuGenerator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }

at::Tensor GetDefaultCpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  return gen.get_state();
}

void SetDefaultCpuRngState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(state);
}

void ResizeStorage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace atl::inner::compat
