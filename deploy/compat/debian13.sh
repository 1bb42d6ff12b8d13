#!/usr/bin/env bash
# Builds atoll and runs its suite against Debian 13's libtorch 2.6 (CPU), in a Debian 13 root made
# with debootstrap (the second libtorch generation atoll supports; CI runs Debian 12's 1.13).
#   deploy/compat/debian13.sh                 root, packages, build (build-trixie/), whole suite
#   deploy/compat/debian13.sh -R 'Cli|Grpc'   ... with these ctest arguments instead (default: all
#                                             but the deploy.* checks)
#   ATOLL_TRIXIE_ROOT=DIR                     where the root lives (default /var/tmp/atoll-trixie)
#   ATOLL_DEBIAN_MIRROR=URL                   the Debian mirror (default deb.debian.org)
# Needs root (debootstrap, chroot, bind mounts). The repository is bind-mounted at /atoll inside.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
root="${ATOLL_TRIXIE_ROOT:-/var/tmp/atoll-trixie}"
mirror="${ATOLL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
source "$repo/deploy/compat/root.sh"
make_root trixie "$root" "$mirror"

# The build's packages, from the same list as Debian 12's set-up.
in_root env ATOLL_SETUP=packages bash /atoll/deploy/setup.sh
echo "debian13: $(in_root dpkg-query -W -f='libtorch-dev ${Version}' libtorch-dev)"

jobs="${ATOLL_JOBS:-$(nproc)}"
in_root cmake -S /atoll -B /atoll/build-trixie -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  ${ATOLL_CMAKE_ARGS:-} >/dev/null
in_root cmake --build /atoll/build-trixie -j "$jobs"
# The deploy.* checks (Kubernetes manifests, a one-node Slurm) test no libtorch code and need tools
# the root does not have: they run in the Debian 12 suite.
args=" -E ^deploy\\."
(($#)) && args="$(printf ' %q' "$@")"
in_root bash -c "cd /atoll/build-trixie && ctest -j $jobs --output-on-failure$args"
