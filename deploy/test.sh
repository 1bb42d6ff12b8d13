#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up (idempotent), build, ctest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ATOLL_TEST_TOOLS=1 "$root/deploy/setup.sh"
cd "${ATOLL_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${ATOLL_JOBS:-$(nproc)}" --timeout 600 "$@"
