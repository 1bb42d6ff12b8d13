#!/usr/bin/env bash
# Checks `atoll plan` against the netns testbed: for each link rate and method, runs the islands
# behind the shaped link (deploy/wan_testbed.sh), then asks the planner for the same run with the
# measured inputs (each island's inner step time, and the goodput its state fetch measured when it
# joined: the whole model through atoll's gRPC channel, what auto-tune uses too; iperf3's figure for
# the same link is shown beside it) and prints predicted against measured compute utilization.
# Needs root (ip netns, tc), like the testbed.
#
#   deploy/plan_check.sh [RATE ...]          # default: 5mbit 20mbit 100mbit
#   STEPS=300 METHODS="streaming_fp4_warm streaming_fp4 sparse_int2_warm" deploy/plan_check.sh 5mbit
#
# Environment: STEPS (150), OUT (runs/plan-check-<time>), CONFIG (deploy/configs/tiny.toml),
# METHODS ("diloco_fp32 streaming_fp4"; the names below). The config's warm start (tiny: 50
# one-step rounds of the whole model) is off except in the *_warm methods.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
atoll="${ATOLL_BUILD_DIR:-$root/build}/src/atoll"
config="${CONFIG:-$root/deploy/configs/tiny.toml}"
steps="${STEPS:-150}"
out="${OUT:-$root/runs/plan-check-$(date +%H%M%S)}"
rates=("$@")
((${#rates[@]})) || rates=(5mbit 20mbit 100mbit)
# Evaluation and checkpoints are not part of the schedule the planner replays: one batch at the end.
common=("--train.steps=$steps" "--train.eval_every=$steps" "--train.eval_batches=1"
        "--optim.warmup_steps=10")
streaming="--outer.num_fragments=4 --outer.fragment_sync_delay=5"
sparse="--outer.codec=int2 --outer.topk_density=0.01 --outer.error_feedback=true --outer.optimizer=sgd"
declare -A methods=(
  [diloco_fp32]="--outer.codec=fp32 --outer.warm_start_steps=0"
  [streaming_fp4]="--outer.codec=fp4_e2m1 $streaming --outer.warm_start_steps=0"
  [streaming_fp4_warm]="--outer.codec=fp4_e2m1 $streaming"
  [sparse_int2_warm]="$sparse $streaming"
)
read -r -a chosen <<< "${METHODS:-diloco_fp32 streaming_fp4}"
# The planner's method: sparse runs are Streaming DiLoCo with a sparse codec.
planned() { case "$1" in diloco*) echo diloco ;; *) echo streaming ;; esac; }
mkdir -p "$out"
echo "| link | iperf3 | method (island) | step time | link measured by the island | measured utilization | predicted | difference |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
for rate in "${rates[@]}"; do
  for method in "${chosen[@]}"; do
    [[ -n "${methods[$method]:-}" ]] || { echo "plan_check: unknown method $method" >&2; exit 1; }
    # shellcheck disable=SC2206
    flags=(${methods[$method]})
    dir="$out/$rate-$method"
    RUN_DIR="$dir" CONFIG="$config" "$root/deploy/wan_testbed.sh" "$rate" "${common[@]}" \
      "${flags[@]}" > "$dir.log" 2>&1 || { echo "plan_check: $rate $method failed: $dir.log" >&2; exit 1; }
    goodput=$(sed -n 's/.*iperf3 goodput \([0-9.]*\) Mbit\/s.*/\1/p' "$dir.log")
    [[ -n "$goodput" ]] || { echo "plan_check: no iperf3 goodput in $dir.log" >&2; exit 1; }
    # Each island: measured utilization, and the planner fed its step time and the goodput.
    for island in "$dir"/island*/summary.json; do
      read -r compute wall stepped link < <(perl -0ne '
        my ($c) = /"compute_s":\s*([0-9.e+-]+)/; my ($w) = /"wall_s":\s*([0-9.e+-]+)/;
        my ($s) = /"steps_trained":\s*([0-9]+)/; my ($l) = /"link_mbps":\s*([0-9.e+-]+)/;
        print "$c $w $s $l\n"' "$island")
      # A first joiner that built the seeded parameters itself fetched nothing, so measured no
      # link: the planner then gets iperf3's goodput of the same link.
      link_source="$(perl -e "printf '%.1f', $link") Mbit/s"
      if perl -e "exit($link > 0 ? 1 : 0)"; then link="$goodput"; link_source="none (iperf3's)"; fi
      step_time=$(perl -e "printf '%.5f', $compute / $stepped")
      measured=$(perl -e "printf '%.1f', 100 * $compute / $wall")
      predicted=$("$atoll" plan --config "$config" "${common[@]}" "${flags[@]}" \
        --method "$(planned "$method")" --steps "$steps" --step-time "$step_time" \
        --bandwidth "${link}mbit" --json | perl -ne 'printf "%.1f", 100 * $1 if /"utilization":([0-9.e+-]+)/')
      printf "| %s | %.1f Mbit/s | %s (%s) | %.1f ms | %s | %s%% | %s%% | %+.1f |\n" \
        "$rate" "$goodput" "$method" "$(basename "$(dirname "$island")")" \
        "$(perl -e "print 1000 * $step_time")" "$link_source" "$measured" "$predicted" \
        "$(perl -e "print $predicted - $measured")"
    done
  done
done
