#!/usr/bin/env bash
# Islands behind a slow link, on one machine: a coordinator and M islands in their own network
# namespaces, each island joined to the coordinator by a veth pair rate-limited with tbf in both
# directions. Prints each island's compute utilization (inner compute time / wall time) and the
# link's measured goodput (iperf3, when installed). Needs root (ip netns, tc).
#
#   deploy/wan_testbed.sh RATE [atoll config overrides...]
#   deploy/wan_testbed.sh 20mbit --train.steps=200 --outer.codec=fp4_e2m1
#
# Environment: ISLANDS (2), CONFIG (deploy/configs/tiny.toml), RUN_DIR (runs/wan-<rate>-<time>),
# LINK_CHAOS: "seed=N,every=S,down=S" takes a random island's link down (ip link set down) for
# `down` seconds at exponential gaps of mean `every` seconds, drawn from the seed, from 10 s after
# the islands start until the run ends; the run then reports its goodput (tokens that reached the
# global model / tokens the run trains without failures) and the islands' bit-identity.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rate="${1:?usage: wan_testbed.sh RATE [--key=value ...]}"
shift
islands="${ISLANDS:-2}"
config="${CONFIG:-$root/deploy/configs/tiny.toml}"
run_dir="${RUN_DIR:-$root/runs/wan-$rate-$(date +%H%M%S)}"
atoll="${ATOLL_BUILD_DIR:-$root/build}/src/atoll"
port=7070
ns="atoll$$"
export ATOLL_TOKEN="${ATOLL_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}"

cleanup() {
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns-c" 2>/dev/null || true
  for ((i = 0; i < islands; i++)); do ip netns del "$ns-i$i" 2>/dev/null || true; done
}
trap cleanup EXIT

ip netns add "$ns-c"
ip -n "$ns-c" link set lo up
for ((i = 0; i < islands; i++)); do
  ip netns add "$ns-i$i"
  ip -n "$ns-i$i" link set lo up
  ip link add "v$$c$i" type veth peer name "v$$i$i"
  ip link set "v$$c$i" netns "$ns-c"
  ip link set "v$$i$i" netns "$ns-i$i"
  ip -n "$ns-c" addr add "10.77.$i.1/24" dev "v$$c$i"
  ip -n "$ns-i$i" addr add "10.77.$i.2/24" dev "v$$i$i"
  ip -n "$ns-c" link set "v$$c$i" up
  ip -n "$ns-i$i" link set "v$$i$i" up
  # Both directions of the island's link are limited to RATE.
  ip netns exec "$ns-c" tc qdisc add dev "v$$c$i" root tbf rate "$rate" burst 64kb latency 100ms
  ip netns exec "$ns-i$i" tc qdisc add dev "v$$i$i" root tbf rate "$rate" burst 64kb latency 100ms
done
mkdir -p "$run_dir"

source "$root/deploy/iperf_goodput.sh"
echo "wan_testbed: link $rate, iperf3 goodput $(iperf_goodput "$ns-c" "$ns-i0" 10.77.0.1) Mbit/s"

ip netns exec "$ns-c" "$atoll" coordinator --listen "0.0.0.0:$port" --config "$config" \
  --run-dir "$run_dir/coordinator" "--outer.islands=$islands" "$@" > "$run_dir/coordinator.log" 2>&1 &
coordinator=$!
sleep 1
pids=()
for ((i = 0; i < islands; i++)); do
  ip netns exec "$ns-i$i" "$atoll" island --coordinator "10.77.$i.1:$port" --name "island$i" \
    --config "$config" --run-dir "$run_dir/island$i" "--outer.islands=$islands" "$@" \
    > "$run_dir/island$i.log" 2>&1 &
  pids+=($!)
done
chaos_pid=
if [[ -n "${LINK_CHAOS:-}" ]]; then
  seed=1 every=30 down=10
  IFS=, read -ra chaos_keys <<< "$LINK_CHAOS"
  for kv in "${chaos_keys[@]}"; do
    case "$kv" in
      seed=*) seed="${kv#seed=}" ;; every=*) every="${kv#every=}" ;; down=*) down="${kv#down=}" ;;
      *) echo "wan_testbed: LINK_CHAOS: unknown key '$kv' (seed, every, down)" >&2; exit 2 ;;
    esac
  done
  (
    # awk's srand/rand: the same seed gives the same failures on any machine with this awk.
    awk -v seed="$seed" -v every="$every" -v n="$islands" \
      'BEGIN {srand(seed); for (k = 0; k < 1000; ++k) printf "%.2f %d\n", -every * log(1 - rand()), int(rand() * n)}' |
      { sleep 10; while read -r gap island; do
          sleep "$gap"
          echo "wan_testbed: chaos: link of island$island down for ${down}s"
          ip -n "$ns-i$island" link set "v$$i$island" down
          sleep "$down"
          ip -n "$ns-i$island" link set "v$$i$island" up
          echo "wan_testbed: chaos: link of island$island up"
        done; }
  ) &
  chaos_pid=$!
fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
if [[ -n "$chaos_pid" ]]; then
  pkill -P "$chaos_pid" 2>/dev/null || true
  kill "$chaos_pid" 2>/dev/null || true
  for ((i = 0; i < islands; i++)); do ip -n "$ns-i$i" link set "v$$i$i" up 2>/dev/null || true; done
fi
# A run whose islands failed never ends on the coordinator's side: stop it.
if ((status != 0)); then kill "$coordinator" 2>/dev/null || true; fi
wait "$coordinator" || true
if ((status != 0)); then
  echo "wan_testbed: an island failed; logs in $run_dir" >&2
  exit 1
fi
for ((i = 0; i < islands; i++)); do
  awk -F': ' -v name="island$i" '
    /"compute_s"/ {c = $2 + 0} /"sync_s"/ {s = $2 + 0} /"wall_s"/ {w = $2 + 0}
    /"bytes_sent"/ {b = $2 + 0} /"val_loss"/ {v = $2 + 0}
    END {printf "wan_testbed: %s: utilization %.1f%% (compute %.1fs, sync %.1fs, wall %.1fs), sent %.1f MiB, val_loss %.4f\n",
         name, 100 * c / w, c, s, w, b / 1048576, v}' "$run_dir/island$i/summary.json"
done
if [[ -n "$chaos_pid" ]]; then
  # Fragment 0's rounds carry every contribution's tokens once (as atoll local --chaos counts).
  committed=$(awk -F'"tokens":' '/"fragment":0[,}]/ {split($2, a, /[,}]/); t += a[1]} END {printf "%d", t}' \
    "$run_dir/coordinator/rounds.jsonl")
  expected=$(cat "$run_dir"/island*/summary.json | awk -F': ' '/"tokens"/ {t += $2 + 0} END {printf "%d", t}')
  hashes=$(cat "$run_dir"/island*/summary.json | awk -F'"' '/"global_hash"/ {print $4}' | sort -u | wc -l)
  awk -v c="$committed" -v e="$expected" -v h="$hashes" 'BEGIN {
    printf "wan_testbed: chaos: goodput %.1f%% (%d of %d tokens reached the global model), global parameters %s\n",
      100 * c / e, c, e, h == 1 ? "bit-identical" : "DIFFER"}'
fi
echo "wan_testbed: outputs in $run_dir"
