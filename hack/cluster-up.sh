#!/usr/bin/env bash
# Start etcd + kube-apiserver + kube-controller-manager on loopback; prints `export KUBECONFIG=...`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
exec python3 "$REPO/hack/localcluster.py" up "$@"
