# Sourced by the network-namespace scripts: iperf_goodput SERVER_NS CLIENT_NS SERVER_ADDRESS prints
# one TCP stream's goodput from the client's namespace to the server's in Mbit/s ("?" without
# iperf3).
iperf_goodput() {
  if ! command -v iperf3 >/dev/null; then
    echo "?"
    return
  fi
  ip netns exec "$1" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  sleep 0.5
  local g
  g=$(ip netns exec "$2" iperf3 -c "$3" -p 5201 -t 3 -J 2>/dev/null |
    perl -0ne 'print $1 / 1e6 if /"sum_received".*?"bits_per_second":\s*([0-9.e+]+)/s')
  echo "${g:-?}"
}
