#!/usr/bin/env bash
# Make a release: hack/release.sh VERSION --registry HOST[:PORT]/PATH [--ca-file CA] [--source-url URL] ...
# (hack/release.py says what it does and what makes it stop; docs/releasing.md how to use it.)
# Credentials: PKO_REGISTRY_USERNAME / PKO_REGISTRY_PASSWORD. Prints dist/VERSION's path.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="$(bash "$REPO/hack/venv.sh")"
# The kubectl built with the supported Kubernetes renders config/ (its kustomize), not the machine's.
KUBE_BIN="$("$PY" "$REPO/hack/localcluster.py" build | tail -1)"
export PATH="$KUBE_BIN:$PATH" PYTHON="$PY"
exec "$PY" "$REPO/hack/release.py" "$@"
