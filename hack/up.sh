#!/usr/bin/env bash
# The main job, end to end on this machine: a real single-node Kubernetes (hack/localnode.py), the
# images built offline (hack/build-images.sh), pko installed with Kustomize (config/local) and running
# in the cluster, then the sample Program + Stack (config/samples) applied and waited for until Ready.
# A second run reuses every cache (kube binaries, images) and recreates the node. Stop: hack/down.sh
#
# Stand-ins: only the Pulumi CLI (images/workspace-standin, TEST-ONLY; no registry here ships it).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
say() { printf '\n== %s\n' "$*" >&2; }

PY="$(bash hack/venv.sh)"
export PYTHON="$PY"    # hack/build-agent.sh builds the agent with the project's virtualenv
say "kube binaries (built once, cached in ~/.cache/pko)"
"$PY" hack/localcluster.py build >/dev/null
say "images (offline; cached by content in ~/.cache/pko/images)"
bash hack/build-images.sh >/dev/null
say "the node: etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, kube-proxy, DNS"
python3 hack/localnode.py up >/dev/null
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

say "the sample: kubectl apply -n default -k config/samples"
kubectl apply --server-side -n default -k config/samples >/dev/null
if ! kubectl -n default wait stack/random --for=condition=Ready --timeout=600s; then
  echo "hack/up.sh: the sample Stack did not become Ready; what the cluster says:" >&2
  kubectl -n default get stacks,workspaces,updates,pods -o wide >&2 || true
  kubectl -n default describe stack random >&2 || true
  kubectl -n pulumi-kubernetes-operator logs deployment/controller-manager --tail=50 >&2 || true
  exit 1
fi

kubectl -n default get stacks,workspaces,updates
cat <<NEXT

pko is running in the cluster and the sample Stack is Ready. Next:

  export KUBECONFIG=$KUBECONFIG
  kubectl get stacks,workspaces,updates -A
  kubectl get stack random -o yaml                   # status: lastUpdate, outputs ([secret])
  kubectl logs random-workspace-0 -c pulumi           # the workspace agent's log
  kubectl exec -it random-workspace-0 -c pulumi -- sh -c 'cd /share/workspace && pulumi stack ls'
  kubectl -n pulumi-kubernetes-operator port-forward svc/pulumi-kubernetes-operator-metrics 8383 &
  curl -s localhost:8383/metrics | grep ^stacks_      # stacks_active, stacks_failing
  hack/down.sh                                        # stop the node, remove everything

(The Pulumi CLI in the workspace pod is a TEST-ONLY stand-in: images/workspace-standin.)
NEXT
