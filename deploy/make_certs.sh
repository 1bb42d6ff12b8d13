#!/usr/bin/env bash
# Makes a run's certificate authority, the coordinator's certificate and one client certificate per
# island (its common name is the island's name: with mutual TLS an island can act only as itself).
#
#   deploy/make_certs.sh DIR [--hosts H1,H2,...] ISLAND [ISLAND ...]
#
# DIR gets ca.pem (give it to every party), ca.key (keep it offline), coordinator.pem/.key and
# ISLAND.pem/.key. --hosts lists the names and IP addresses islands use to reach the coordinator
# (default localhost,127.0.0.1). Then:
#   atoll coordinator ... --tls-cert DIR/coordinator.pem --tls-key DIR/coordinator.key --tls-ca DIR/ca.pem
#   atoll island --name ISLAND ... --tls-ca DIR/ca.pem --tls-cert DIR/ISLAND.pem --tls-key DIR/ISLAND.key
set -euo pipefail
usage() { echo "usage: $0 DIR [--hosts H1,H2,...] ISLAND [ISLAND ...]" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
dir="$1"; shift
hosts="localhost,127.0.0.1"
if [[ "$1" == "--hosts" ]]; then
  [[ $# -ge 3 ]] || usage
  hosts="$2"; shift 2
fi
command -v openssl >/dev/null || { echo "$0: openssl is needed (apt-get install openssl)" >&2; exit 1; }
for name in "$@"; do
  [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]] ||
    { echo "$0: '$name' is not a valid island name (1-64 of A-Z a-z 0-9 . _ -)" >&2; exit 2; }
done
mkdir -p "$dir"
umask 077
days=365
newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [[ ! -f "$dir/ca.pem" ]]; then
  newkey "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -days "$days" -subj "/CN=atoll run CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$dir/ca.pem" 2>/dev/null
fi

# sign NAME SAN EXTENDED_KEY_USAGE
sign() {
  local name="$1" san="$2" eku="$3" ext
  ext="$(mktemp)"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n' "$eku" >"$ext"
  [[ -n "$san" ]] && printf 'subjectAltName=%s\n' "$san" >>"$ext"
  newkey "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "/CN=$name" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr" "$ext"
}

san=""
IFS=',' read -ra list <<<"$hosts"
for h in "${list[@]}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san+="${san:+,}IP:$h"; else san+="${san:+,}DNS:$h"; fi
done
sign coordinator "$san" serverAuth
for name in "$@"; do sign "$name" "" clientAuth; done
chmod 644 "$dir"/*.pem
echo "certificates in $dir: ca.pem, coordinator.pem, $(printf '%s.pem ' "$@")"
