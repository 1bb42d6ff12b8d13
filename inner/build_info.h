// What this build of atoll was made with, torch-free (`atoll --version`; defined with the other
// libtorch bridges in inner/torch_compat.cc).
#ifndef ATOLL_INNER_BUILD_INFO_H_
#define ATOLL_INNER_BUILD_INFO_H_

#include <string>

namespace atl::inner {

// "1.13.0": the libtorch the build compiled against.
std::string TorchVersion();
// Whether that libtorch is built with CUDA, and the CUDA devices it sees now.
bool TorchCudaBuild();
int CudaDeviceCount();

}  // namespace atl::inner

#endif  // ATOLL_INNER_BUILD_INFO_H_
