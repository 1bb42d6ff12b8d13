#!/usr/bin/env bash
# The manifest checker catches the mistakes it is there for: each edit of datacenter A's rendered
# manifests below must be reported, naming the problem.
#   tests/deploy/manifests_test.sh ATOLL_BINARY
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
binary="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
kubectl kustomize "$root/deploy/kubernetes/datacenter-a" >"$out/a.yaml"
failures=0
expect() {  # expect SED_EDIT PROBLEM
  sed "$1" "$out/a.yaml" >"$out/edited.yaml"
  if /usr/bin/python3 "$root/deploy/kubernetes/check_manifests.py" "$out/edited.yaml" "$binary" >"$out/report" 2>&1; then
    echo "FAIL: '$1' passed the checker"; failures=$((failures + 1))
  elif ! grep -qF -- "$2" "$out/report"; then
    echo "FAIL: '$1' was reported without '$2':"; cat "$out/report"; failures=$((failures + 1))
  else
    echo "ok: '$1' -> $2"
  fi
}
expect 's/livenessProbe/livenesProbe/' "unknown field 'livenesProbe' (V1Container)"
expect 's/replicas: 1/replicas: "1"/' "spec.replicas: expected int, got '1'"
expect 's/port: http$/port: htp/' "livenessProbe port htp is not a container port"
expect 's/containerPort: 29400/containerPort: 29401/' "--listen port 29400 is not a container port"
expect 's/value: "2"/value: "3"/' "completions/parallelism must equal WORLD_SIZE (3)"
expect 's/atoll-island-0.atoll-island/atoll-island-1.atoll-island/' "MASTER_ADDR must be pod 0"
expect 's/--metrics-listen/--metric-listen/' "atoll island has no flag --metric-listen"
expect 's/secretName: atoll-tls/secretName: atoll-tl/' "volume tls: no Secret atoll-tl"
expect 's/completionMode: Indexed/completionMode: NonIndexed/' "need completionMode: Indexed"
exit $failures
