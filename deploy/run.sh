#!/usr/bin/env bash
# The main job from a fresh machine: set-up, fetch the Brown corpus, train `tiny` on it.
# Extra arguments go to `atoll train` (e.g. --train.steps=200).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/deploy/setup.sh"
"$root/deploy/fetch_brown.sh"
cd "$root"
run_dir="${ATOLL_RUN_DIR:-runs/tiny-$(date +%Y%m%d-%H%M%S)}"
exec "${ATOLL_BUILD_DIR:-$root/build}/src/atoll" train --config deploy/configs/tiny.toml \
  --run-dir "$run_dir" "$@"
