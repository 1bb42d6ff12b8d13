#!/usr/bin/env bash
# There (a GPU machine with a CUDA PyTorch, no package registry): builds atoll against that
# PyTorch's libtorch and checks it on the GPU in one command, writing a report.
#   bash deploy/gpu/check.sh [BUNDLE]     (BUNDLE from deploy/gpu/bundle.sh; default build-gpu/bundle)
#   ATOLL_REPORT_DIR=DIR                  where the report and logs go (default $OUT, else build-gpu/report)
#   ATOLL_CHECK_STEPS="build codec train bench local"   the steps to run (default all, in order;
#                                         "configure" alone: unpack and configure only)
#   ATOLL_PYTHON=PYTHON                   the Python whose torch (and NVIDIA wheels) to build
#                                         against (default python3)
#   ATOLL_TORCH_PREFIX=DIR                a libtorch's CMake prefix instead of that Python's torch
#   ATOLL_CHECK_TARGETS="..."             what the build step builds (default the checks' five;
#                                         "all": every target, as the "suite" step needs)
#   ATOLL_CMAKE_ARGS="..."                more CMake arguments
# Steps: unpack the bundle's .debs into build-gpu/prefix (dpkg -x, never into /); configure against
# the local libtorch with CUDA kernels for the local GPU and NCCL (nvcc from PATH, /usr/local/cuda
# or the Python's NVIDIA wheels); build the targets the checks need with every core; run the CUDA
# tests (codecs bit for bit against the CPU; training on the GPU); the GPU benchmark (tokens/s and
# MFU of ~125M and ~1B GPTs in bf16, the 1B outer round's cost against H = 100 steps); a 2-island
# `atoll local` on the one GPU with Streaming DiLoCo and FP4. Sized to finish in under 8 minutes on
# one H200 with 16 cores. A step that fails is reported and the later ones still run where they
# can. Not in the default: "suite", the whole ctest suite against this libtorch (with
# ATOLL_CHECK_TARGETS=all; without a GPU the CUDA tests skip: deploy/gpu/rehearse.sh).
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
bundle="$(cd "${1:-$repo/build-gpu/bundle}" 2>/dev/null && pwd)" || {
  echo "check: no bundle at ${1:-$repo/build-gpu/bundle} (run deploy/gpu/bundle.sh here first)" >&2
  exit 2
}
prefix="$repo/build-gpu/prefix"
build="$repo/build-gpu/build"
report="${ATOLL_REPORT_DIR:-${OUT:-$repo/build-gpu/report}}"
steps="${ATOLL_CHECK_STEPS:-build codec train bench local}"
mkdir -p "$report" "$prefix"
summary="$report/report.md"
start=$(date +%s)
: > "$summary"
say() { printf '%s\n' "$*" | tee -a "$summary"; }
elapsed() { echo "$(($(date +%s) - start)) s"; }
failed=0
# step NAME LOG COMMAND...: runs it with its output in LOG, says how it went.
step() {
  local name="$1" log="$report/$2"
  shift 2
  local t0=$(date +%s)
  if "$@" > "$log" 2>&1; then
    say "- $name: ok ($(($(date +%s) - t0)) s, log $(basename "$log"))"
    return 0
  fi
  failed=1
  say "- $name: FAILED ($(($(date +%s) - t0)) s); the end of $(basename "$log"):"
  tail -n 25 "$log" | sed 's/^/      /' | tee -a "$summary" >/dev/null
  return 1
}
wants() { [[ " $steps " == *" $1 "* ]]; }

say "# atoll GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
say ""
say "- machine: $(nproc) cores; $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# 1. The bundle's packages, unpacked into a prefix; links that point into / are pointed into it
# where it holds their target.
unpack() {
  for deb in "$bundle"/debs/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$prefix" || return 1
    else
      local tmp
      tmp="$(mktemp -d)"
      (cd "$tmp" && ar x "$deb" && tar xf data.tar.* -C "$prefix") || return 1
      rm -rf "$tmp"
    fi
  done
  # A link to a base library the bundle leaves out (libz.so -> /lib/.../libz.so.1) keeps the
  # system's: otherwise it dangles and the static archive beside it is taken instead.
  find "$prefix" -type l -lname '/*' | while read -r link; do
    [[ -e "$prefix$(readlink "$link")" ]] && ln -sfn "$prefix$(readlink "$link")" "$link"
  done
  return 0
}
# A prefix or build made where the repository had another path (a copy of the tree moved) is made
# afresh: its links and CMake cache name that path.
if [[ "$(cat "$prefix/.unpacked" 2>/dev/null)" != "$repo" ]]; then
  rm -rf "$prefix" "$build"
  mkdir -p "$prefix"
  step "unpack $(ls "$bundle"/debs/*.deb | wc -l) packages" unpack.log unpack && echo "$repo" > "$prefix/.unpacked"
fi

lib="$prefix/usr/lib/x86_64-linux-gnu"
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Debian's multiarch headers (OpenSSL's opensslconf.h) sit beside the prefix's include dir, where
# the compiler only looks for the system's.
export CPATH="$prefix/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
# pkg-config (xxhash, cpp-httplib and what they require) from the prefix only, its paths rebased.
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"

# 2. The local libtorch: the Python's torch (its CMake prefix, NCCL's headers from its wheel), and
# a CUDA compiler: nvcc on PATH, CUDA's usual place, or NVIDIA's wheel beside torch
# (nvidia-cuda-nvcc: site-packages/nvidia/cu13/bin/nvcc).
python="${ATOLL_PYTHON:-python3}"
torch_prefix="${ATOLL_TORCH_PREFIX:-$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)}"
torch_version="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')"
nccl_include="$("$python" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null || true)"
nvcc="$(command -v nvcc || true)"
[[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -z "$nvcc" ]] && nvcc="$("$python" -c 'import glob, nvidia
found = sorted(f for p in nvidia.__path__ for f in glob.glob(p + "/cu*/bin/nvcc"))
print(found[-1] if found else "")' 2>/dev/null || true)"
say "- nvcc: ${nvcc:-none} $("$nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*')"
say "- libtorch: $torch_version at $torch_prefix"
[[ -n "$torch_prefix" ]] || { say "- no libtorch found ($python -c 'import torch' failed; set ATOLL_PYTHON or ATOLL_TORCH_PREFIX)"; exit 1; }
# The torch wheel's own libraries (and NVIDIA's, beside it) at run time.
torch_lib="$(cd "$torch_prefix/../../lib" 2>/dev/null && pwd || true)"
[[ -n "$torch_lib" ]] && export LD_LIBRARY_PATH="$torch_lib:$LD_LIBRARY_PATH"
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)"

configure() {
  local args=(-S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DATOLL_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" "-DCMAKE_PREFIX_PATH=$prefix/usr;$torch_prefix"
    -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc" -DOPENSSL_ROOT_DIR="$prefix/usr"
    -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" -DATOLL_LINK_SYSTEM_GLOO=OFF
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5)  # CMake 4 (pip's) with packages' configs of older CMakes
  [[ -n "$nccl_include" ]] && args+=(-DATOLL_NCCL_INCLUDE="$nccl_include")
  [[ -n "$nvcc" ]] && args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  command -v ninja >/dev/null && args+=(-G Ninja)
  # More from the caller, e.g. -DATOLL_LINK_SYSTEM_GLOO=ON for a libtorch without gloo inside.
  read -r -a more <<< "${ATOLL_CMAKE_ARGS:-}"
  args+=("${more[@]}")
  cmake "${args[@]}"
}
read -r -a targets <<< "${ATOLL_CHECK_TARGETS:-atoll compression_test trainer_test diloco_test gpu_bench}"
if wants build || wants configure; then
  step "configure (CUDA arch ${arch:-90})" configure.log configure || exit 1
  grep -E '^-- atoll:' "$report/configure.log" | sed 's/^/      /' | tee -a "$summary" >/dev/null
fi
if wants build; then
  step "build ${targets[*]} ($(nproc) jobs)" build.log cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
  # What the build made: every CUDA object compiled, every binary linked.
  say "      $(grep -c 'Building CUDA object' "$report/build.log") CUDA objects and" \
      "$(grep -c 'Building CXX object' "$report/build.log") C++ objects compiled," \
      "$(grep -c 'Linking CXX executable' "$report/build.log") executables linked"
fi
wants build || wants codec || wants train || wants bench || wants local || wants suite || exit "$failed"
bin="$build"
[[ -x "$bin/src/atoll" ]] || { say "- no atoll binary: the later steps need the build"; exit 1; }

# 3. CUDA tests: the codecs on the GPU against the CPU, byte for byte; training on the GPU.
if wants codec; then
  step "codec kernels vs CPU, bit for bit" codec_test.log "$bin/tests/compression_test" --gtest_filter='CodecCuda*'
  grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$report/codec_test.log" | sed 's/^/      /' | tee -a "$summary" >/dev/null
fi
if wants train; then
  step "training and the outer sync on the GPU" train_test.log bash -c \
    "'$bin/tests/trainer_test' --gtest_filter='*Gpu*:*Device*' && '$bin/tests/diloco_test' --gtest_filter='*Gpu*:*Device*'"
  grep -E '^\[  (PASSED|SKIPPED|FAILED) |^\[       OK' "$report/train_test.log" | sed 's/^/      /' | tee -a "$summary" >/dev/null
fi

# 4. The GPU benchmark (prints its own table; see tests/bench/gpu_bench.cc for the formulas).
if wants bench; then
  step "gpu_bench: 125M and 1B GPTs, a 1B Llama, bf16" gpu_bench.log "$bin/tests/bench/gpu_bench" --models 125m,1b,llama-1b --steps 10
  say ""
  grep -E '^(\||gpu_bench:)' "$report/gpu_bench.log" | tee -a "$summary" >/dev/null
  say ""
fi

# 5. Two islands on the one GPU (two processes), Streaming DiLoCo with FP4 pseudo-gradients.
if wants local; then
  data="$bundle/data/brown"
  run="$repo/build-gpu/runs/local2"
  rm -rf "$run"
  step "atoll local: 2 islands on one GPU, 4 fragments, FP4, 300 steps" local.log \
    "$bin/src/atoll" local --islands 2 --config "$repo/deploy/configs/small.toml" --run-dir "$run" \
    --data.path="$data/train.txt" --data.val_path="$data/val.txt" \
    --train.device=cuda --train.mixed_precision=bf16 --train.steps=300 --train.eval_every=100 \
    --train.checkpoint_every=0 --outer.sync_every=50 --outer.num_fragments=4 \
    --outer.fragment_sync_delay=5 --outer.codec=fp4_e2m1 --outer.warm_start_steps=0
  # Each island's summary: compute utilization (inner steps' time / wall time), where its
  # pseudo-gradients were made, rounds, resyncs, validation loss.
  python3 - "$run" <<'EOF' | tee -a "$summary"
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/*/summary.json")):
    s = json.load(open(path))
    print(f"      {path.split('/')[-2]}: utilization {100 * s.get('utilization', 0):.1f}%, "
          f"global copy {s.get('global_copy')}, rounds {s.get('rounds')}, resyncs {s.get('resyncs')}, "
          f"step {s.get('step_ms', 0):.1f} ms, sync {s.get('sync_s', 0):.1f} s of {s.get('wall_s', 0):.1f} s, "
          f"val_loss {s.get('val_loss', float('nan')):.4f}")
EOF
fi

# 6. The whole suite against this libtorch (the CUDA tests skip without a GPU).
if wants suite; then
  step "ctest: the whole suite" suite.log ctest --test-dir "$build" -j "$(nproc)" --timeout 600 --output-on-failure
  grep -E 'tests passed|Total Test time' "$report/suite.log" | sed 's/^/      /' | tee -a "$summary" >/dev/null
fi

say ""
say "- total: $(elapsed); $([[ $failed == 0 ]] && echo 'every step ok' || echo 'some steps FAILED')"
exit "$failed"
