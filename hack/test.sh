#!/usr/bin/env bash
# The test command: venv, lint (ruff + mypy --strict), the whole pytest suite against a real control
# plane that the tests start themselves (or $KUBECONFIG), then the end-to-end suite (e2e/) on a real
# node this machine runs (hack/localnode.py; skipped, with the reason, where a node cannot run).
# Extra args go to the first pytest run. Each run ends with its 25 slowest steps (CI's budget, issue 45). PKO_SKIP_E2E=1 skips the e2e suite.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
PY="$(bash hack/venv.sh)"
# Build (or reuse the cached) Kubernetes + etcd (hack/build-kubernetes.sh) and the real Pulumi engine (CLI,
# language hosts, providers: hack/build-pulumi.sh), all from their Go modules, before pytest's timeouts
# start. The tests' kubectl is the one built with the control plane (the machine's may be out of skew).
KUBE_BIN="$("$PY" hack/localcluster.py build | tail -1)"
export PATH="$KUBE_BIN:$PATH"
bash hack/build-pulumi.sh >/dev/null
bash hack/build-helm.sh >/dev/null   # the chart's tests render and install with the real helm
bash hack/build-registry.sh >/dev/null   # the release tests push to a real OCI registry (Distribution)
bash hack/build-prometheus.sh >/dev/null   # promtool tests the alert rules; a real Prometheus fires them
bash hack/build-kstatus.sh >/dev/null   # kstatus (cli-utils) judges Stacks as Flux and kpt do
bash hack/lint.sh

check() {  # pytest's exit code 5 (nothing collected) is a failure, not a pass
  if [ "$1" -eq 5 ]; then echo "hack/test.sh: pytest collected no tests in $2: that is a failure" >&2; return 1; fi
  return "$1"
}
# The e2e suite's node boots in the background while the unit suite runs (its images are cached, so
# it mostly waits on the kubelet); the e2e fixture uses it when this boot succeeded, and boots one
# itself otherwise. A run that stops before the e2e suite takes the node down.
NODE_JOB=""
if [ "${PKO_SKIP_E2E:-}" != 1 ] && [ "$(id -u)" -eq 0 ]; then
  mkdir -p .node
  ( PYTHON="$PY" bash hack/build-images.sh >/dev/null && "$PY" hack/localnode.py up >/dev/null ) \
    > .node/preboot.log 2>&1 &
  NODE_JOB=$!
  trap '[ -z "$NODE_JOB" ] || { wait "$NODE_JOB"; "$PY" hack/localnode.py down >/dev/null 2>&1; }' EXIT
fi
set +e
# The suite's files run on PKO_TEST_WORKERS workers (pytest-xdist; each its own control plane, a file's
# tests together and in order): its tests mostly wait on apiservers and pods (31 min in one process on
# 2 cores, using a third of one), 9.5 min on 4. PKO_TEST_WORKERS=0 runs it in this process.
WORKERS="${PKO_TEST_WORKERS:-4}"
PARALLEL=(); [ "$WORKERS" = 0 ] || PARALLEL=(-n "$WORKERS" --dist loadfile)
"$PY" -m pytest -p no:cacheprovider "${PARALLEL[@]}" --durations=25 "$@"
rc=$?
set -e
check "$rc" test/ || exit $?
if [ "${PKO_SKIP_E2E:-}" = 1 ]; then
  echo "hack/test.sh: PKO_SKIP_E2E=1: the e2e suite was not run" >&2
  exit 0
fi
if [ -n "$NODE_JOB" ]; then
  if wait "$NODE_JOB"; then export PKO_E2E_NODE_BOOTED=1
  else echo "hack/test.sh: the node's background boot failed (.node/preboot.log); the e2e suite boots it" >&2
  fi
  NODE_JOB=""  # the e2e suite owns the node from here (its fixture takes it down)
fi
set +e
"$PY" -m pytest -p no:cacheprovider --durations=25 -rs e2e
rc=$?
set -e
check "$rc" e2e/
