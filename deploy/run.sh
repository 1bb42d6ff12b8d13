#!/usr/bin/env bash
# The main job from a fresh machine: set-up, fetch the Brown corpus, then train `tiny` with two
# islands through a real coordinator over TCP (loopback), printing the rounds as they commit.
# Extra arguments go to `atoll local` (e.g. --islands 3 --outer.sync_every=25).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/deploy/setup.sh"
"$root/deploy/fetch_brown.sh"
cd "$root"
run_dir="${ATOLL_RUN_DIR:-runs/tiny-$(date +%Y%m%d-%H%M%S)}"
exec "${ATOLL_BUILD_DIR:-$root/build}/src/atoll" local --islands 2 \
  --config deploy/configs/tiny.toml --run-dir "$run_dir" "$@"
