#!/usr/bin/env bash
# Stop the control plane started by hack/cluster-up.sh.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
exec python3 "$REPO/hack/localcluster.py" down "$@"
