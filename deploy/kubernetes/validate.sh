#!/usr/bin/env bash
# Validates the Kubernetes manifests offline with the tools Debian ships: `kubectl kustomize`
# renders each datacenter's set (kustomize's own checks), then check_manifests.py checks every
# object against Kubernetes' API models (python3-kubernetes), the wiring between objects, and each
# atoll flag against the binary.
#   deploy/kubernetes/validate.sh [ATOLL_BINARY]     (default: build/src/atoll)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${1:-$here/../../build/src/atoll}"
python=/usr/bin/python3  # Debian's, with python3-kubernetes and python3-yaml
for tool in kubectl "$python"; do
  command -v "$tool" >/dev/null || { echo "validate.sh: error: $tool is missing (deploy/setup.sh with ATOLL_TEST_TOOLS=1 installs it)" >&2; exit 1; }
done
"$python" -c 'import kubernetes, yaml' 2>/dev/null ||
  { echo "validate.sh: error: python3-kubernetes is missing (apt-get install python3-kubernetes)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
for site in datacenter-a datacenter-b; do
  kubectl kustomize "$here/$site" >"$out/$site.yaml"
  "$python" "$here/check_manifests.py" "$out/$site.yaml" "$binary" || status=1
done
exit $status
