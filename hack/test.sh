#!/usr/bin/env bash
# The test command: venv, lint (ruff + mypy --strict), the whole pytest suite against a real control
# plane that the tests start themselves (or $KUBECONFIG), and beside it the end-to-end suite (e2e/) on a
# real node this machine runs (hack/localnode.py; skipped, with the reason, where a node cannot run).
# Extra args go to the first pytest run. Each run ends with its 25 slowest steps. PKO_SKIP_E2E=1 skips the e2e suite.
set -euo pipefail
case "${1:-}" in -h|--help)  # before the venv and lint, which the first run would otherwise start
  sed -n '2,5p' "$0" | cut -c3-; exit 0 ;;
esac
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
PY="$(bash hack/venv.sh)"
# Build (or reuse the cached) Kubernetes + etcd (hack/build-kubernetes.sh), which both sides below need:
# the unit suite's control planes and the e2e suite's node. The tests' kubectl is the one built with the
# control plane (the machine's may be out of skew).
KUBE_BIN="$("$PY" hack/localcluster.py build | tail -1)"
export PATH="$KUBE_BIN:$PATH"

check() {  # pytest's exit code 5 (nothing collected) is a failure, not a pass
  if [ "$1" -eq 5 ]; then echo "hack/test.sh: pytest collected no tests in $2: that is a failure" >&2; return 1; fi
  return "$1"
}
# The e2e side runs beside the unit side from here (issue 45: CI's budget): it builds the images the
# node boots with (hack/build-images.sh sample: the workspace image waits for the engine the unit side
# is building, through build-pulumi.sh's lock; the base, operator and agent images, mostly downloads,
# are built meanwhile), boots the node, and runs the e2e modules one after another while the unit side
# builds its own tools, lints and runs its suite, whose workers mostly wait on their own apiservers.
# What only some modules need is built after the boot, beside the first modules: the Go operator
# (hack/build-peer.sh: about 4 minutes cold), which test_switch.py takes from the cache, then SeaweedFS
# (hack/build-images.sh s3: about 10), which only the S3 modules run, imported into the running node
# when built; those modules run last and wait for it (e2e/conftest.py's seaweedfs_image, through
# PKO_E2E_LATE_IMAGES). The side's output goes to .node/e2e.log (the builds after the boot: to
# .node/late-images.log, printed after it), printed when the unit suite has ended; a boot that fails
# leaves the node to the e2e fixture, which builds every image and boots it itself.
built_images() {  # SET: build hack/build-images.sh's SET; IMPORTS=(--import ARCHIVE ...) for localnode.py
  local archives
  archives="$(PYTHON="$PY" bash hack/build-images.sh "$1")" || return
  IMPORTS=(); while read -r archive; do IMPORTS+=(--import "$archive"); done <<<"$archives"
}
e2e_side() {
  set +e +m
  local late=""
  if [ "$(id -u)" -eq 0 ]; then
    rm -f .node/late-images.rc .node/late-images.rc.partial
    if built_images sample && "$PY" hack/localnode.py up "${IMPORTS[@]}" >/dev/null; then
      export PKO_E2E_NODE_BOOTED=1   # the e2e suite owns the node from here (its fixture takes it down)
      (  # the Go operator first: test_switch.py takes it from the cache (or waits on its build's lock)
        bash hack/build-peer.sh >/dev/null \
          || echo "hack/test.sh: the Go operator's build failed here; test_switch.py builds it again"
        built_images s3 && "$PY" hack/localnode.py import-images "${IMPORTS[@]}" >/dev/null
        echo $? > .node/late-images.rc.partial; mv .node/late-images.rc.partial .node/late-images.rc
      ) > .node/late-images.log 2>&1 &
      late=$!
      export PKO_E2E_LATE_IMAGES="$REPO/.node/late-images.rc"
    else
      echo "hack/test.sh: the node's background boot failed; the e2e suite boots it" >&2
    fi
  fi
  "$PY" -m pytest -p no:cacheprovider --durations=25 -rs e2e
  echo $? > .node/e2e.rc
  if [ -n "$late" ]; then  # done before the S3 modules began, unless the suite ended before them
    wait "$late"
    echo "==================== built beside the first modules (the Go operator, SeaweedFS) ===================="
    cat .node/late-images.log
  fi
}
E2E_JOB=""
if [ "${PKO_SKIP_E2E:-}" != 1 ]; then
  mkdir -p .node; rm -f .node/e2e.rc
  # The e2e side in a process group of its own (job control, for this one job; stdin from /dev/null, as
  # a background job's is without it): a run that ends before the unit suite has (a build or lint
  # failed, ^C, a TERM) ends that group and takes the node down, instead of waiting for the e2e suite.
  set -m
  e2e_side < /dev/null > .node/e2e.log 2>&1 &
  E2E_JOB=$!
  set +m
  trap '[ -z "$E2E_JOB" ] || { kill -TERM -- "-$E2E_JOB" 2>/dev/null; wait "$E2E_JOB" || true
    "$PY" hack/localnode.py down >/dev/null 2>&1 || true; }' EXIT
  trap 'exit 130' INT   # (^C reaches only this group now: the trap above stops the other)
  trap 'exit 143' TERM
fi
# The unit side: the real Pulumi engine (CLI, language hosts, providers: hack/build-pulumi.sh) and the
# tools its tests run, all from their Go modules, before pytest's timeouts start; then lint.
bash hack/build-pulumi.sh >/dev/null
bash hack/build-helm.sh >/dev/null   # the chart's tests render and install with the real helm
bash hack/build-registry.sh >/dev/null   # the release tests push to a real OCI registry (Distribution)
bash hack/build-prometheus.sh >/dev/null   # promtool tests the alert rules; a real Prometheus fires them
bash hack/build-kstatus.sh >/dev/null   # kstatus (cli-utils) judges Stacks as Flux and kpt do
bash hack/lint.sh

set +e
# The suite's files run on PKO_TEST_WORKERS workers (pytest-xdist; each its own control plane, a file's
# tests together and in order): its tests mostly wait on apiservers and pods (31 min in one process on
# 2 cores, using a third of one), 9.5 min on 4. PKO_TEST_WORKERS=0 runs it in this process.
WORKERS="${PKO_TEST_WORKERS:-4}"
PARALLEL=(); [ "$WORKERS" = 0 ] || PARALLEL=(-n "$WORKERS" --dist loadfile)
"$PY" -m pytest -p no:cacheprovider "${PARALLEL[@]}" --durations=25 "$@"
rc=$?
set -e
if [ -z "$E2E_JOB" ]; then
  echo "hack/test.sh: PKO_SKIP_E2E=1: the e2e suite was not run" >&2
  check "$rc" test/
  exit $?
fi
echo "hack/test.sh: the unit suite has ended; waiting for the e2e suite (.node/e2e.log)" >&2
wait "$E2E_JOB" || true
E2E_JOB=""
echo "==================== e2e (run beside the unit suite) ===================="
cat .node/e2e.log
e2e_rc="$(cat .node/e2e.rc 2>/dev/null || echo 1)"
unit_ok=0; check "$rc" test/ || unit_ok=$?
check "$e2e_rc" e2e/ || exit $?
exit "$unit_ok"
