#!/usr/bin/env bash
# Rehearses deploy/gpu/check.sh here, where there is no GPU, against what the GPU machines carry:
# PyPI's torch (2.11, CUDA 13) with CUDA's compiler from NVIDIA's wheels, in a venv. check.sh's
# configure and build run as they will run there (the bundle's packages unpacked, CMake's prefix
# from that torch): every CUDA object compiles and every binary links, or it fails. deploy/test.sh
# (CI) runs it.
#   deploy/gpu/rehearse.sh [VENV]       default build/venv (deploy/python_venv.sh makes it)
#   ATOLL_CHECK_TARGETS=all             every target instead of check.sh's five
#   ATOLL_CHECK_STEPS="build suite"     and the whole CPU suite against that libtorch (the CUDA
#                                       tests skip); default "build"
# The report and logs land in build-gpu/rehearsal/.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$(cd "${1:-$repo/build/venv}" 2>/dev/null && pwd)" ||
  { echo "rehearse: no venv at ${1:-$repo/build/venv} (deploy/python_venv.sh makes one)" >&2; exit 2; }
python="$venv/bin/python"
cuda="$("$python" -c 'import torch; print(torch.version.cuda or "")')"
[[ -n "$cuda" ]] || { echo "rehearse: $venv's torch is a CPU build: no CUDA to build against" >&2; exit 2; }
# nvcc, and the headers CUDA 13 keeps apart (CCCL: thrust, CUB, libcu++), at torch's CUDA release.
# CUDA 13's compiler comes in parts (the front end's headers, NVVM) that pip would otherwise take
# at their newest release, whose PTX this ptxas refuses; CUDA 12's wheels carry a -cu12 suffix.
major="${cuda%%.*}"
if ((major < 13)); then
  toolkit=("nvidia-cuda-nvcc-cu$major" "nvidia-cuda-cccl-cu$major")
else
  toolkit=(nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-cccl)
fi
"$venv/bin/pip" install -q "${toolkit[@]/%/==$cuda.*}"
[[ -d "$repo/build-gpu/bundle/debs" ]] || ATOLL_BUNDLE_CORPUS=0 "$repo/deploy/gpu/bundle.sh"
ATOLL_PYTHON="$python" ATOLL_REPORT_DIR="$repo/build-gpu/rehearsal" \
  ATOLL_CHECK_STEPS="${ATOLL_CHECK_STEPS:-build}" exec bash "$repo/deploy/gpu/check.sh"
