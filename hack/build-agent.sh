#!/usr/bin/env bash
# Build the self-contained `agent` executable (PyInstaller one-file: interpreter + dependencies).
#
# Usage: hack/build-agent.sh [OUTPUT_DIR]        (default: dist/agent-bin; prints the executable's path)
#
# Why one file: the workspace pod's init container copies it into the shared /share volume and the
# main container runs it inside whatever Pulumi image the user picked, which has no Python of ours.
# The project is installed (not editable) into a scratch site-packages first, because PyInstaller
# cannot follow the editable install's import hook that maps agent/ and api/ into `pko`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
OUT="${1:-$REPO/dist/agent-bin}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/pko-agent-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m PyInstaller --version >/dev/null 2>&1 || {
    echo "build-agent: PyInstaller is missing: pip install -e '.[dev]'" >&2
    exit 1
}

# The project itself, as a real package tree (dependencies come from the venv).
"$PYTHON" -m pip install --quiet --no-deps --no-build-isolation --target "$WORK/site" "$REPO" >&2

"$PYTHON" -m PyInstaller \
    --onefile \
    --name agent \
    --noconfirm \
    --clean \
    --log-level WARN \
    --paths "$WORK/site" \
    --collect-submodules pko \
    --collect-submodules pulumi.automation \
    --copy-metadata pulumi \
    --distpath "$OUT" \
    --workpath "$WORK/build" \
    --specpath "$WORK" \
    "$WORK/site/pko/agent/__main__.py" >&2

echo "$OUT/agent"
