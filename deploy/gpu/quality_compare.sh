#!/usr/bin/env bash
# Best-vs-best DiLoCo (M = 2) against the centralized baseline on one GPU, at the scale the papers
# measure (a model of tens of millions of parameters), sized to a time budget:
#   deploy/gpu/quality_compare.sh [SECONDS] [CONFIG]     (default 420 s, deploy/configs/small.toml)
# It measures the island's throughput with a short probe, then chooses train.steps so that the whole
# grid (baseline at 2 inner learning rates, DiLoCo at 2 x 2 inner and outer ones, the warm start on)
# fits the budget, and prints the tokens per parameter that bought. Both islands of a DiLoCo run
# share the GPU (two processes). Needs atoll built against a CUDA libtorch (deploy/gpu/check.sh,
# issue 12) and the Brown corpus in data/brown (deploy/fetch_brown.sh here; it travels with the tree).
# Brown is 5.7M bytes: at 20 tokens per parameter a 10M-parameter model sees it ~35 times, so
# compare the methods with each other, not with published losses.
set -euo pipefail
cd "$(dirname "$0")/../.."
budget="${1:-420}"
config="${2:-deploy/configs/small.toml}"
atoll="${ATOLL_BIN:-build/src/atoll}"
run="${ATOLL_RUN_DIR:-runs/gpu-quality}"
device=(--train.device=auto --train.mixed_precision=bf16)
[[ -x "$atoll" ]] || { echo "quality_compare: no $atoll (build atoll first)" >&2; exit 1; }
[[ -s data/brown/train.txt ]] || { echo "quality_compare: no data/brown (deploy/fetch_brown.sh)" >&2; exit 1; }
mkdir -p "$run"

# 1. The island's throughput: 60 steps, timed from step 10 (after warm-up and compilation).
rm -rf "$run/probe"
"$atoll" train --config "$config" --run-dir "$run/probe" --train.steps=60 --train.eval_every=0 \
  --train.checkpoint_every=0 --optim.warmup_steps=10 "${device[@]}" > "$run/probe.log" 2>&1
read -r tokens_per_s tokens_per_step params < <(python3 - "$run/probe" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
a = next(r for r in rows if r["step"] >= 10)
b = rows[-1]
rate = (b["tokens"] - a["tokens"]) / max(1e-9, b["wall_s"] - a["wall_s"])
m = re.search(r"([0-9.]+)M parameters", open(sys.argv[1] + "/../probe.log").read())
print(f"{rate:.0f} {b['tokens'] / b['step']:.0f} {m.group(1) + 'M' if m else '?'}")
EOF
)
# 2. Steps per run: 2 baseline runs (batch 2 x b) and 4 DiLoCo runs (2 islands of batch b) each
# train 2 x steps x tokens_per_step tokens; the budget covers all six.
steps=$(python3 -c "print(max(100, int($budget * $tokens_per_s / (6 * 2 * $tokens_per_step))))")
warm=$((steps / 20))
echo "quality_compare: $tokens_per_s tokens/s per island; $steps steps per run (warm start $warm)," \
  "$((2 * steps * tokens_per_step)) tokens per run, $params parameters"
"$atoll" compare --config "$config" --run-dir "$run/compare" --islands 2 "${device[@]}" \
  --train.steps="$steps" --train.eval_every=0 --train.checkpoint_every=0 \
  --outer.warm_start_steps="$warm" --sweep optim.lr=1e-3,2e-3 --sweep outer.lr=0.3,0.5
