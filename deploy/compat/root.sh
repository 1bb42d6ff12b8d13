# Sourced by the scripts that run atoll in a Debian root of their own (deploy/compat/debian13.sh):
# makes the root with debootstrap if it is not there, mounts /proc (tests
# re-execute /proc/self/exe), /dev (Gloo and gRPC use /dev/shm, /dev/urandom) and the repository at
# /atoll, and unmounts all of it on the way out. Then `in_root CMD...` runs a command inside.
#   make_root SUITE ROOT MIRROR      bind SRC DST (more mounts)
[[ $(id -u) -eq 0 ]] || { echo "$(basename "$0"): needs root (debootstrap, chroot)" >&2; exit 1; }
root_mounted=()
root_cleanup() {
  for ((i = ${#root_mounted[@]} - 1; i >= 0; i--)); do umount -l "${root_mounted[i]}" 2>/dev/null || true; done
}
trap root_cleanup EXIT
bind() {  # SRC DST
  mkdir -p "$2"
  mountpoint -q "$2" || { mount --bind "$1" "$2"; root_mounted+=("$2"); }
}
make_root() {  # SUITE ROOT MIRROR
  local suite="$1" dir="$2" mirror="$3" repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  if [[ ! -x "$dir/usr/bin/apt-get" ]]; then
    command -v debootstrap >/dev/null || {
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    echo "$(basename "$0"): making a Debian $suite root in $dir"
    debootstrap --variant=minbase "$suite" "$dir" "$mirror" >/dev/null
  fi
  root_dir="$dir"
  mkdir -p "$dir/proc"
  mountpoint -q "$dir/proc" || { mount -t proc proc "$dir/proc"; root_mounted+=("$dir/proc"); }
  bind /dev "$dir/dev"
  bind /dev/pts "$dir/dev/pts"
  bind "$repo" "$dir/atoll"
  cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
}
in_root() {
  chroot "$root_dir" env -i HOME=/root PATH="${root_path:-/usr/sbin:/usr/bin:/sbin:/bin}" LANG=C.UTF-8 "$@"
}
