#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up (idempotent), build, ctest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# The suite tests the Python package too: its build is required here, not skipped when a
# package is missing.
ATOLL_TEST_TOOLS=1 ATOLL_CMAKE_ARGS="-DATOLL_PYTHON_MODULE=ON ${ATOLL_CMAKE_ARGS:-}" "$root/deploy/setup.sh"
cd "${ATOLL_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${ATOLL_JOBS:-$(nproc)}" --timeout 600 "$@"
