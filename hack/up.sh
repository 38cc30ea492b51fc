#!/usr/bin/env bash
# The main job, end to end on this machine: bring up a local control plane, install pko's CRDs and
# config (config/quickstart = config/default plus the default/pulumi ServiceAccount the sample
# Stack runs its workspace as; server-side apply), apply the sample Program and Stack, and show them.
# Leaves the control plane running; `hack/cluster-down.sh` stops it.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
PY="$(bash hack/venv.sh)"
"$PY" hack/localcluster.py up >/dev/null
export KUBECONFIG="$REPO/.cluster/kubeconfig"
kubectl apply --server-side -k config/quickstart
kubectl wait --for=condition=Established --timeout=60s crd --all >/dev/null
kubectl apply --server-side -k config/samples
kubectl get stacks,programs -A
echo
echo "Control plane: KUBECONFIG=$KUBECONFIG   (stop it with hack/cluster-down.sh)"
