#!/usr/bin/env bash
# The main job, end to end on this machine: a real single-node Kubernetes (hack/localnode.py), the
# images built offline (hack/build-images.sh), pko installed with Kustomize (config/local) and running
# in the cluster, then the sample Program + Stack (config/samples) applied and waited for until Ready.
# A second run reuses every cache (kube binaries, images) and recreates the node. Stop: hack/down.sh
#
# Usage: hack/up.sh [s3]
#   It builds and imports only the images config/local and config/samples run (hack/build-images.sh
#   sample); `s3` adds SeaweedFS, the object store of config/samples/s3 (about 5 minutes more cold).
#   The Go operator (hack/build-peer.sh) is never built here: e2e/ and the benchmarks build it.
#
# The node runs the Kubernetes and etcd of hack/versions.env, built from the Go module proxy by
# hack/build-kubernetes.sh; this script's kubectl is the one built with them (first on PATH), since the
# machine's may be outside the supported version skew.
#
# No stand-ins: the workspace image (images/workspace) carries the real Pulumi CLI, language hosts and
# pulumi-kubernetes, built from their Go modules by hack/build-pulumi.sh (cached in ~/.cache/pko).
set -euo pipefail
SETS=(sample)
for arg in "$@"; do
  case "$arg" in
    s3) SETS+=(s3) ;;
    *) echo "usage: hack/up.sh [s3]" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
say() { printf '\n== %s\n' "$*" >&2; }

PY="$(bash hack/venv.sh)"
export PYTHON="$PY"    # hack/build-agent.sh builds the agent with the project's virtualenv
say "Kubernetes and etcd (built once from the Go module proxy, cached in ~/.cache/pko)"
KUBE_BIN="$("$PY" hack/localcluster.py build | tail -1)"
export PATH="$KUBE_BIN:$PATH"
say "the Pulumi engine and the images: ${SETS[*]} (offline; cached in ~/.cache/pko)"
ARCHIVES="$(bash hack/build-images.sh "${SETS[@]}")"
IMPORTS=()
while read -r archive; do IMPORTS+=(--import "$archive"); done <<<"$ARCHIVES"
say "the node: etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, kube-proxy, DNS"
python3 hack/localnode.py up "${IMPORTS[@]}" >/dev/null   # these archives only, not the whole cache
export KUBECONFIG="$REPO/.node/kubeconfig"

say "pko: kubectl apply --server-side -k config/local"
kubectl apply --server-side -k config/local >/dev/null
for crd in stacks.pulumi.com programs.pulumi.com workspaces.auto.pulumi.com updates.auto.pulumi.com; do
  for _ in $(seq 60); do
    [ "$(kubectl get crd "$crd" -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] && break
    sleep 1
  done
done
kubectl -n pulumi-kubernetes-operator rollout status deployment/controller-manager --timeout=300s

say "the sample's namespace enforces Pod Security restricted: kubectl label namespace default ..."
# A namespace label, not an object in config/samples: `kubectl delete -k config/samples` must never try
# to delete the `default` namespace. The PodSecurity admission (built in since 1.25) enforces it.
kubectl label --overwrite namespace default pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/enforce-version=latest >/dev/null
say "the sample: kubectl apply -n default -k config/samples"
kubectl apply --server-side -n default -k config/samples >/dev/null
if ! kubectl -n default wait stack/hello --for=condition=Ready --timeout=600s; then
  echo "hack/up.sh: the sample Stack did not become Ready; what the cluster says:" >&2
  kubectl -n default get stacks,workspaces,updates,pods,pvc -o wide >&2 || true
  kubectl -n default describe stack hello >&2 || true
  kubectl -n pulumi-kubernetes-operator logs deployment/controller-manager --tail=50 >&2 || true
  exit 1
fi

kubectl version
kubectl -n default get stacks,workspaces,updates
say "what Pulumi deployed (pulumi-kubernetes, with the workspace's ServiceAccount)"
kubectl -n default rollout status deployment/hello --timeout=120s >&2
kubectl -n default get deployments,configmaps -l app.kubernetes.io/name=hello
echo "outputs: $(kubectl -n default get stack hello -o jsonpath='{.status.outputs}')"
cat <<NEXT

pko is running in the cluster and the sample Stack is Ready on the real Pulumi engine. Next:

  export KUBECONFIG=$KUBECONFIG
  export PATH=$KUBE_BIN:\$PATH    # kubectl of the node's release
  kubectl version                                    # the node's Kubernetes release
  kubectl get stacks,workspaces,updates -A
  kubectl get stack hello -o yaml                    # status: lastUpdate, outputs (greeting is [secret])
  kubectl get deploy,cm -l app.kubernetes.io/name=hello   # what Pulumi created
  kubectl logs hello-workspace-0 -c pulumi           # the workspace agent's log
  kubectl exec -it hello-workspace-0 -c pulumi -- sh -c 'cd /share/workspace && pulumi stack --show-urns'
  kubectl delete pod hello-workspace-0               # the state is on the hello-state PVC: nothing is lost
  python3 hack/localnode.py import-images --import "\$(bash hack/build-images.sh s3)"   # the S3 sample's image (hack/up.sh s3 imports it)
  kubectl apply --server-side -n default -k config/samples/s3   # a Stack with its state in S3, in the cluster
  kubectl -n pulumi-kubernetes-operator port-forward svc/pulumi-kubernetes-operator-metrics 8383 &
  curl -s localhost:8383/metrics | grep ^stacks_      # stacks_active, stacks_failing
  hack/down.sh                                        # stop the node, remove everything
NEXT
