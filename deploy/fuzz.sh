#!/usr/bin/env bash
# Long fuzzing runs with libFuzzer, AddressSanitizer and UBSan (clang): every harness of
# tests/fuzz for SECONDS each, starting from the checked-in seed corpus; the corpus grows in
# runs/fuzz/corpus/HARNESS and crashing inputs land in runs/fuzz/crashes/. Prints, per harness,
# the executions, the coverage (libFuzzer's cov: edges and ft: features) and the crashes.
#
#   deploy/fuzz.sh [SECONDS] [HARNESS ...]      (default: 600 s, all harnesses)
#
# The test suite runs the same harnesses briefly with g++ (FuzzSmoke.*, a standalone driver).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-600}"
shift || true
harnesses=("$@")
[[ ${#harnesses[@]} -gt 0 ]] || harnesses=(codec payload push config checkpoint service_state)
build="${ATOLL_FUZZ_BUILD_DIR:-$root/build-fuzz}"
out="$root/runs/fuzz"

if ! command -v clang++-14 >/dev/null || ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz: installing clang-14 and libFuzzer"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    clang-14 libclang-rt-14-dev >/dev/null
fi

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DATOLL_CUDA=OFF \
  -DATOLL_FUZZ=ON -DATOLL_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$sanitize -fsanitize=fuzzer-no-link" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize" >/dev/null
targets=()
for h in "${harnesses[@]}"; do targets+=(--target "fuzz_$h"); done
cmake --build "$build" -j "${ATOLL_JOBS:-$(nproc)}" "${targets[@]}"

mkdir -p "$out/crashes"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1"  # leaks: libtorch's static state
total=0
printf '%-14s %14s %8s %8s %8s\n' harness executions cov ft crashes
for h in "${harnesses[@]}"; do
  mkdir -p "$out/corpus/$h"
  log="$out/$h.log"
  "$build/tests/fuzz/fuzz_$h" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$out/crashes/$h-" -rss_limit_mb=4096 -timeout=30 \
    "$out/corpus/$h" "$root/tests/fuzz/corpus/$h" >"$log" 2>&1 || true
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  cov=$( (grep -oE 'cov: [0-9]+' "$log" || true) | tail -1 | cut -d' ' -f2)
  ft=$( (grep -oE 'ft: [0-9]+' "$log" || true) | tail -1 | cut -d' ' -f2)
  crashes=$(ls "$out/crashes" 2>/dev/null | grep -c "^$h-" || true)
  printf '%-14s %14s %8s %8s %8s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$crashes"
  total=$((total + ${execs:-0}))
done
echo "total executions: $total (logs and crashes in $out)"
