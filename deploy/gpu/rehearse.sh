#!/usr/bin/env bash
# Rehearses deploy/gpu/check.sh here before a GPU machine's minutes are spent on it: in a bare
# Debian 12 root (a compiler, CMake, ninja, Python and Debian's CPU libtorch, which brings protobuf;
# CUDA's toolkit bind-mounted from /usr/local/cuda), so that every other package the build needs
# must come from the bundle, as it must there (Debian's libtorch links gloo separately: the bundle's
# is linked here, never there). Runs check.sh's build and the tests that run
# without a GPU (the CUDA ones skip); the report lands in build-gpu/rehearsal/.
#   deploy/gpu/bundle.sh && sudo deploy/gpu/rehearse.sh
#   ATOLL_BOOKWORM_ROOT=DIR            where the root lives (default /var/tmp/atoll-bookworm)
#   ATOLL_CHECK_STEPS="build codec train"   passed on to check.sh (the default here)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
source "$repo/deploy/compat/root.sh"
make_root bookworm "${ATOLL_BOOKWORM_ROOT:-/var/tmp/atoll-bookworm}" \
  "${ATOLL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[[ -x /usr/local/cuda/bin/nvcc ]] && bind /usr/local/cuda "$root_dir/usr/local/cuda"
in_root bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends build-essential cmake ninja-build python3 libtorch-dev libopenblas0-pthread >/dev/null'
echo "rehearse: the root's own libraries of what the bundle carries:" \
  "$(in_root dpkg-query -W -f='${Package} ' 'libgrpc*' 'libabsl*' 'libgtest*' 'libtomlplusplus*' \
     'libxxhash*' 'libprometheus*' 'libcpp-httplib*' 2>/dev/null || true)"
rm -rf "$repo/build-gpu/build" "$repo/build-gpu/prefix"
root_path=/usr/local/cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin in_root env \
  ATOLL_TORCH_PREFIX=/usr/lib/x86_64-linux-gnu/cmake ATOLL_REPORT_DIR=/atoll/build-gpu/rehearsal \
  ATOLL_CMAKE_ARGS=-DATOLL_LINK_SYSTEM_GLOO=ON \
  ATOLL_CHECK_STEPS="${ATOLL_CHECK_STEPS:-build codec train}" bash /atoll/deploy/gpu/check.sh
