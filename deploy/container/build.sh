#!/usr/bin/env bash
# Builds atoll's container image (deploy/container/Dockerfile) and smoke-tests it: `atoll --help`
# inside. Uses podman, else docker.
#   deploy/container/build.sh [TAG]          (default atoll:latest)
#   ATOLL_BASE_IMAGE=debian:bookworm-slim    the Debian 12 base (default: pulled from Docker Hub)
#   ATOLL_BOOTSTRAP_BASE=1                   no registry: make the base with debootstrap from the
#                                            Debian mirror and import it (needs root, debootstrap)
#   ATOLL_ISOLATION=chroot                   build steps in a chroot (where the OCI runtime cannot
#                                            start containers, e.g. cgroups v1 hosts with crun)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tag="${1:-atoll:latest}"
engine="$(command -v podman || command -v docker || true)"
if [[ -z "$engine" ]]; then
  echo "build.sh: error: neither podman nor docker is installed (apt-get install podman)" >&2
  exit 1
fi
base="${ATOLL_BASE_IMAGE:-docker.io/library/debian:bookworm-slim}"
if [[ -n "${ATOLL_BOOTSTRAP_BASE:-}" ]]; then
  base="localhost/atoll-debian:12"
  if ! "$engine" image inspect "$base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || {
      echo "build.sh: error: ATOLL_BOOTSTRAP_BASE needs debootstrap (apt-get install debootstrap)" >&2
      exit 1
    }
    rootfs="$(mktemp -d)"
    echo "build.sh: bootstrapping a Debian 12 base into $rootfs"
    if ! debootstrap --variant=minbase bookworm "$rootfs" "${ATOLL_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
        >"$rootfs.log" 2>&1; then
      echo "build.sh: error: debootstrap failed (see $rootfs.log): is the Debian mirror reachable?" >&2
      rm -rf "$rootfs"
      exit 1
    fi
    tar -C "$rootfs" -c . | "$engine" import - "$base" >/dev/null
    rm -rf "$rootfs" "$rootfs.log"
  fi
fi
echo "build.sh: building $tag with $(basename "$engine") from $base"
isolation=()
[[ -n "${ATOLL_ISOLATION:-}" && "$(basename "$engine")" == podman ]] && isolation=(--isolation "$ATOLL_ISOLATION")
"$engine" build "${isolation[@]}" --build-arg "DEBIAN_IMAGE=$base" -f "$root/deploy/container/Dockerfile" -t "$tag" "$root"
# The smoke test: `atoll --help`, then 3 training steps and a generated line as the image's user
# (every runtime library loads and works).
smoke='atoll --help | head -3 &&
  cd /tmp && for i in $(seq 3000); do echo "the quick brown fox $i jumps over the lazy dog"; done >t.txt &&
  atoll train --config /opt/atoll/configs/tiny.toml --run-dir /tmp/run --train.steps=3 \
    --optim.warmup_steps=1 --data.path=/tmp/t.txt --data.val_path=/tmp/t.txt --train.eval_batches=1 &&
  atoll generate --checkpoint /tmp/run --prompt "the " --tokens 20 && echo "ran as uid $(id -u)"'
log="${TMPDIR:-/tmp}/atoll-smoke.log"
echo "build.sh: smoke test inside $tag"
if ! "$engine" run --rm --entrypoint /bin/sh "$tag" -c "$smoke" >"$log" 2>&1; then
  # Where the OCI runtime cannot start containers, buildah runs the same image in a chroot.
  if ! command -v buildah >/dev/null || ! grep -q "OCI\|crun\|runc" "$log"; then
    echo "build.sh: error: the smoke test failed:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "build.sh: '$(basename "$engine") run' cannot start containers here ($(grep -m1 -o 'crun.*\|runc.*' "$log")); running the image with buildah in a chroot instead"
  ctr="$(buildah from "$tag")"
  trap 'buildah rm "$ctr" >/dev/null' EXIT
  buildah run --isolation chroot "$ctr" -- /bin/sh -c "$smoke" >"$log" 2>&1 ||
    { echo "build.sh: error: the smoke test failed:" >&2; cat "$log" >&2; exit 1; }
fi
cat "$log"
"$engine" image ls "$tag"
