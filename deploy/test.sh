#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up (idempotent), a virtual environment with a
# torch from PyPI and the wheel (deploy/python_venv.sh), build, ctest. The Python tests run twice:
# under Debian's python3-torch with the build's package (python.*) and under PyPI's torch with the
# installed wheel (python_pip.*). Then the GPU machines' build, rehearsed against that PyPI torch
# (CUDA 13) with CUDA's compiler from NVIDIA's wheels: every CUDA object compiles and the GPU
# check's binaries link (deploy/gpu/rehearse.sh; ATOLL_GPU_REHEARSAL=0 skips it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${ATOLL_VENV:-$root/build/venv}"
ATOLL_TEST_TOOLS=1 ATOLL_SETUP=packages "$root/deploy/setup.sh"
"$root/deploy/python_venv.sh" "$venv"
# The suite tests the Python package too: its build is required here, not skipped when a
# package is missing.
ATOLL_SKIP_APT=1 ATOLL_CMAKE_ARGS="-DATOLL_PYTHON_MODULE=ON -DATOLL_PYTHON_VENV=$venv ${ATOLL_CMAKE_ARGS:-}" \
  "$root/deploy/setup.sh"
(cd "${ATOLL_BUILD_DIR:-$root/build}" &&
  ctest --output-on-failure -j "${ATOLL_JOBS:-$(nproc)}" --timeout 600 "$@")
if [[ "${ATOLL_GPU_REHEARSAL:-1}" != 0 ]]; then
  "$root/deploy/gpu/rehearse.sh" "$venv"
fi
