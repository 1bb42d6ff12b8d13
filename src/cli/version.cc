#include "src/cli/version.h"

#include "absl/strings/str_cat.h"
#include "compression/codec_cuda.h"
#include "inner/build_info.h"

namespace atl {

std::string VersionText() {
  const char* commit =
#include "cli/commit.inc"
      ;
  const int gpus = inner::CudaDeviceCount();
  const std::string torch =
      inner::TorchCudaBuild()
          ? absl::StrCat("libtorch ", inner::TorchVersion(), " with CUDA (", gpus, " GPU",
                         gpus == 1 ? "" : "s", " visible)")
          : absl::StrCat("libtorch ", inner::TorchVersion(), " for the CPU");
  std::string kernels = "CPU only";
  if (compression::cuda::Supports(compression::Codec::kFp32)) {
    std::string why;
    kernels = compression::cuda::Available(&why) ? "CPU and CUDA"
                                                 : absl::StrCat("CPU and CUDA (unused: ", why, ")");
  }
  return absl::StrCat("atoll ", ATOLL_VERSION, " (commit ", commit, ")\n", torch,
                      "\ncodec kernels: ", kernels, "\n");
}

}  // namespace atl
