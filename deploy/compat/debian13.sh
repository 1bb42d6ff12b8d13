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
[[ $(id -u) -eq 0 ]] || { echo "debian13.sh: needs root (debootstrap, chroot)" >&2; exit 1; }

if [[ ! -x "$root/usr/bin/apt-get" ]]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  echo "debian13: making a Debian 13 root in $root"
  debootstrap --variant=minbase trixie "$root" "$mirror" >/dev/null
fi

# /proc (tests re-execute /proc/self/exe), /dev (Gloo and gRPC use /dev/shm, /dev/urandom), the
# repository; all unmounted on the way out.
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() {  # SRC DST
  mkdir -p "$2"
  mountpoint -q "$2" || { mount --bind "$1" "$2"; mounted+=("$2"); }
}
mkdir -p "$root/proc"
mountpoint -q "$root/proc" || { mount -t proc proc "$root/proc"; mounted+=("$root/proc"); }
bind /dev "$root/dev"
bind /dev/pts "$root/dev/pts"
bind "$repo" "$root/atoll"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

in_root() { chroot "$root" env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

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
