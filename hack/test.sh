#!/usr/bin/env bash
# The test command: venv, lint (ruff + mypy --strict), then the whole pytest suite against a real
# control plane that the tests start themselves (or $KUBECONFIG). Extra args go to pytest.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
PY="$(bash hack/venv.sh)"
# Build (or reuse the cached) kube binaries and install etcd before pytest's timeouts start.
"$PY" hack/localcluster.py build >/dev/null
bash hack/lint.sh
set +e
"$PY" -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "hack/test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
