#!/usr/bin/env bash
# Compiles atoll's CUDA-only code paths (NCCL process groups in inner/parallel/communicator.cc,
# the sync debug mode in inner/torch_compat.cc) against a libtorch's headers without building or
# linking anything: `g++ -fsyntax-only` with USE_C10D_NCCL and ATOLL_TORCH_CUDA, the CUDA
# toolkit's headers (cuda_runtime.h, nccl.h) and the libtorch's.
#   deploy/compat/cuda_paths.sh [TORCH_INCLUDE]   (default /usr/include: the installed libtorch-dev)
#   deploy/compat/cuda_paths.sh --trixie          Debian 13's CUDA libtorch (libtorch-cuda-dev 2.6,
#                                                 contrib), its .deb unpacked into build-cuda-headers/
#                                                 (nothing installed: it needs cuDNN's installer)
#   ATOLL_CUDA_INCLUDE=DIR                        CUDA's headers (default /usr/local/cuda/include)
#   ATOLL_CXX_STANDARD=17|20                      (default 17)
# A CPU libtorch's headers lack one generated header of c10's CUDA part (its build flags); a
# two-line stand-in defines what a shared CUDA build would. Exit 0 when every file compiles.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
torch_include="${1:-/usr/include}"
if [[ "$torch_include" == --trixie ]]; then
  dir="$repo/build-cuda-headers"
  mkdir -p "$dir/parts" "$dir/lists/partial" "$dir/archives/partial" "$dir/root"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main contrib\nSigned-By: %s\n' \
    "${ATOLL_DEBIAN_MIRROR:-http://deb.debian.org/debian}" /usr/share/keyrings/debian-archive-keyring.gpg \
    > "$dir/parts/trixie.sources"
  apt=(apt-get -qq -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$dir/parts"
       -o Dir::State::Lists="$dir/lists" -o Dir::Cache::Archives="$dir/archives")
  "${apt[@]}" update
  (cd "$dir" && rm -f ./*.deb && "${apt[@]}" download libtorch-cuda-dev 2>/dev/null)
  dpkg -x "$dir"/libtorch-cuda-dev_*.deb "$dir/root"
  torch_include="$dir/root/usr/include"
fi
cuda_include="${ATOLL_CUDA_INCLUDE:-/usr/local/cuda/include}"
std="${ATOLL_CXX_STANDARD:-17}"
for need in "$torch_include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp" "$cuda_include/nccl.h" \
            "$cuda_include/cuda_runtime_api.h"; do
  [[ -f "$need" ]] || { echo "cuda_paths: $need is missing" >&2; exit 2; }
done
shim="$(mktemp -d)"
trap 'rm -rf "$shim"' EXIT
if [[ ! -f "$torch_include/c10/cuda/impl/cuda_cmake_macros.h" ]]; then
  mkdir -p "$shim/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$shim/c10/cuda/impl/cuda_cmake_macros.h"
fi
version_h="$torch_include/torch/csrc/api/include/torch/version.h"
version="$(awk '/define TORCH_VERSION_(MAJOR|MINOR|PATCH)/ {v = v (v ? "." : "") $3} END {print v}' "$version_h" 2>/dev/null)"
# /usr/include is searched anyway (naming it again would break libstdc++'s #include_next).
extra=()
[[ "$torch_include" != /usr/include ]] && extra=(-isystem "$torch_include")
files=(inner/parallel/communicator.cc inner/torch_compat.cc)
for f in "${files[@]}"; do
  t0=$(date +%s)
  g++ -fsyntax-only -std=c++"$std" -DUSE_C10D_GLOO -DUSE_C10D_NCCL -DATOLL_TORCH_CUDA -DUSE_DISTRIBUTED -DNOMINMAX \
    -D_GLIBCXX_USE_CXX11_ABI=1 -pthread -Wall -Wextra -Wno-sign-compare -Wno-unused-parameter \
    -Wno-missing-field-initializers -I"$repo" -isystem "$torch_include/torch/csrc/api/include" \
    "${extra[@]}" -isystem "$shim" -isystem "$cuda_include" "$repo/$f"
  echo "cuda_paths: $f compiles with CUDA and NCCL against libtorch $version ($torch_include), C++$std ($(($(date +%s) - t0)) s)"
done
