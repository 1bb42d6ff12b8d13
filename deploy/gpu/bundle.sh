#!/usr/bin/env bash
# Here (a Debian 12 machine with apt): gathers what a GPU machine without a package registry needs
# to build atoll, beside the CUDA libtorch it already has (a PyTorch installation's):
#   deploy/gpu/bundle.sh [DIR]        (default build-gpu/bundle, ignored by git)
# DIR/debs holds Debian 12's .deb files of atoll's build dependencies (gRPC, protobuf, Abseil, the
# config and test libraries) and the runtime libraries they load; the base system's (libc, libstdc++,
# zlib's runtime) are left out: any Linux with a compiler has them. Debian 12's are chosen for its
# glibc 2.36, older than the GPU machines'. DIR/data/brown is the corpus for the 2-island run.
# deploy/gpu/check.sh unpacks them there (dpkg -x, never into /). ATOLL_BUNDLE_CORPUS=0 leaves the
# corpus out (check.sh's build steps need only the packages: deploy/gpu/rehearse.sh).
# Then, with the device tool: carry DIR and run `bash deploy/gpu/check.sh DIR`.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/build-gpu/bundle}"

# What atoll's CMakeLists find, and what their CMake configs ask for in turn (gRPC: protobuf,
# OpenSSL, c-ares, re2, zlib; prometheus-cpp: civetweb, zlib, curl).
build_deps=(
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev libgmock-dev googletest libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libxxhash-dev prometheus-cpp-dev libcpp-httplib-dev libsentencepiece-dev libre2-dev libc-ares-dev
  libssl-dev
  zlib1g-dev libbrotli-dev libcivetweb-dev libcurl4-openssl-dev pkgconf pkgconf-bin libpkgconf3
)
# Taken alone, without what they depend on: gloo's headers, which c10d's ProcessGroupGloo.hpp
# includes where a libtorch does not ship them (Debian's; a wheel's own come first), and its
# library for a libtorch that links gloo separately (Debian's; check.sh links it only when asked).
alone=(libgloo-dev libgloo0)
# The base system, present on any machine that can compile: never carried.
base='^(libc6|libc6-dev|libc-dev-bin|libgcc-s1|gcc-[0-9]+-base|libstdc\+\+6|libcrypt1|libcrypt-dev|linux-libc-dev|libnsl-dev|libnsl2|libtirpc-common|libtirpc-dev|libtirpc3|rpcsvc-proto|zlib1g|libzstd1|libffi8|libselinux1|libpcre2-8-0|debconf|dpkg|perl-base|tar)$'
# The libraries that only curl loads (atoll never links prometheus-cpp's push client): its CMake
# config wants libcurl's files to exist, not to load.
curl_only='^(libcom-err2|libdb5\.3|libgmp10|libgnutls30|libgssapi-krb5-2|libhogweed6|libidn2-0|libk5crypto3|libkeyutils1|libkrb5-3|libkrb5support0|libldap-2\.5-0|libnettle8|libnghttp2-14|libp11-kit0|libpsl5|librtmp1|libsasl2-2|libsasl2-modules-db|libssh2-1|libtasn1-6|libunistring2)$'

command -v apt-get >/dev/null || { echo "bundle: needs apt-get (a Debian 12 machine)" >&2; exit 1; }
mkdir -p "$out/debs"
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${build_deps[@]}" 2>/dev/null |
  grep -v '^[ <]' | sort -u | grep -Ev "$base" | grep -Ev "$curl_only")
((${#closure[@]} > 0)) || { echo "bundle: apt-cache knows none of the packages (run apt-get update)" >&2; exit 1; }
(cd "$out/debs" && rm -f ./*.deb && apt-get download -qq "${closure[@]}" "${alone[@]}")
echo "bundle: $((${#closure[@]} + ${#alone[@]})) packages, $(du -sh "$out/debs" | cut -f1) in $out/debs"

[[ "${ATOLL_BUNDLE_CORPUS:-1}" == 0 ]] || "$root/deploy/fetch_brown.sh" "$out/data/brown"
# What the device tool carries: the tree (tracked and untracked files git does not ignore) and
# the bundle, 64 MiB at most.
total=$(du -sb "$out" | cut -f1)
tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard |
  { du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
echo "bundle: $((total >> 20)) MiB + the tree's $((tree >> 20)) MiB = $(((total + tree) >> 20)) MiB" \
  "(the device tool carries 64 MiB)"
((total + tree < (60 << 20))) || { echo "bundle: too large to carry beside the tree" >&2; exit 1; }
