#!/usr/bin/env bash
# One island's outer-sync goodput over 1, 2, 4, ... connections (outer.connections) behind a
# shaped link: the service (build/tests/bench/link_bench serve) and the island in their own
# network namespaces, joined by a veth pair limited with `tc tbf` to RATE in both directions.
# Needs root (ip netns, tc).
#
# This machine cannot add delay to a link (no netem): the round trip stays under a millisecond and
# one TCP stream fills the link by itself. With PER_CONNECTION=RATE2 each TCP connection is also
# capped at RATE2 (an htb class per island port, the island's ports pinned to 64 of them), which is
# what a window-limited stream gets on a long fat pipe (window / RTT), while the link stays RATE.
#
#   deploy/link_check.sh RATE [ELEMENTS] [CODEC] [ROUNDS] [CONNECTIONS]
#   deploy/link_check.sh 100mbit 10000000 fp4_e2m1 3 1,2,4,8
#   PER_CONNECTION=10mbit deploy/link_check.sh 100mbit 10000000 fp4_e2m1 3 1,2,4,8,16
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rate="${1:?usage: link_check.sh RATE [ELEMENTS] [CODEC] [ROUNDS] [CONNECTIONS]}"
elements="${2:-10000000}"
codec="${3:-fp4_e2m1}"
rounds="${4:-3}"
connections="${5:-1,2,4,8}"
bench="${ATOLL_BUILD_DIR:-$root/build}/tests/bench/link_bench"
ns="atlk$$"

cleanup() {
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns-s" 2>/dev/null || true
  ip netns del "$ns-i" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$ns-s"
ip netns add "$ns-i"
ip link add "v$$s" type veth peer name "v$$i"
ip link set "v$$s" netns "$ns-s"
ip link set "v$$i" netns "$ns-i"
ip -n "$ns-s" addr add 10.78.0.1/24 dev "v$$s"
ip -n "$ns-i" addr add 10.78.0.2/24 dev "v$$i"
per_connection="${PER_CONNECTION:-}"
# The island's connections use ports 40000-40063 (one htb class each with PER_CONNECTION).
ip netns exec "$ns-i" sysctl -qw net.ipv4.ip_local_port_range="40000 40063"
for side in s i; do
  ip -n "$ns-$side" link set lo up
  ip -n "$ns-$side" link set "v$$$side" up
  dev="v$$$side"
  if [[ -z "$per_connection" ]]; then
    ip netns exec "$ns-$side" tc qdisc add dev "$dev" root tbf rate "$rate" burst 64kb latency 100ms
    continue
  fi
  # The island's port is the source of what it sends and the destination of what it receives.
  key=$([[ $side == i ]] && echo sport || echo dport)
  tc_() { ip netns exec "$ns-$side" tc "$@"; }
  tc_ qdisc add dev "$dev" root handle 1: htb default 1
  tc_ class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" quantum 60000
  for ((p = 0; p < 64; p++)); do
    # A small assured rate: connections borrow from the link's class up to their cap, so the link
    # stays RATE whatever their number.
    tc_ class add dev "$dev" parent 1:1 classid "1:$((100 + p))" htb rate 100kbit \
      ceil "$per_connection" quantum 60000
    tc_ filter add dev "$dev" parent 1: protocol ip prio 1 u32 match ip "$key" "$((40000 + p))" \
      0xffff flowid "1:$((100 + p))"
  done
done

source "$root/deploy/iperf_goodput.sh"
echo "link_check: link $rate${per_connection:+, $per_connection per connection}, iperf3 goodput" \
  "$(iperf_goodput "$ns-s" "$ns-i" 10.78.0.1) Mbit/s (one TCP stream)"
ip netns exec "$ns-s" "$bench" serve 10.78.0.1:7071 "$elements" "$codec" > /dev/null &
sleep 1
ip netns exec "$ns-i" "$bench" push 10.78.0.1:7071 "$elements" "$codec" "$rounds" "$connections"
