#!/usr/bin/env bash
# Build the self-contained `agent` (PyInstaller one-folder: the executable `agent`, and beside it
# `agent-lib/` with the interpreter and dependencies; the executable finds it by that relative path).
#
# Usage: hack/build-agent.sh [OUTPUT_DIR]   (default: dist/agent-bin; prints the executable's path,
#                                            OUTPUT_DIR/agent/agent, with OUTPUT_DIR/agent/agent-lib beside it)
#
# Why self-contained: the workspace pod's init container copies it into the shared /share volume and
# the main container runs it inside whatever Pulumi image the user picked, which has no Python of ours.
# Why one folder, not one file: a one-file executable unpacks its whole bundle (130 MB) into /tmp at
# every start, about a second before any of our code runs, twice per pod (`init`, then `serve`); the
# folder is copied once per pod (`cp -r`, a fraction of that) and starts as fast as `python -m`.
# The project is installed (not editable) into a scratch site-packages first, because PyInstaller
# cannot follow the editable install's import hook that maps agent/ and api/ into `pko`.
# Only the agent's part of the project is collected (pko.agent, pko.api, and what they import, e.g.
# pko.logging, and the metrics server's pko.machinery.serving, metricsauth and servingcert, which import
# no API client), not the operator's (pko.controllers, the rest of pko.machinery). kubernetes_asyncio and aiohttp
# are excluded: the agent talks to the apiserver with its own client (pko.agent.kubeapi), and
# test/agent/test_kubeapi_http.py checks that nothing it imports needs them. mypy and hypothesis are
# pulled in only by pydantic's plugins for them, which the agent never loads.
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

# What is bundled is the locked packages (requirements.lock, and PyInstaller from requirements-build.lock):
# the venv must hold exactly those versions (hack/venv.sh installs them; agent/Dockerfile likewise).
"$PYTHON" "$REPO/hack/locks.py" check-installed || {
    echo "build-agent: $PYTHON does not hold the locked packages" >&2
    exit 1
}

# The project itself, as a real package tree (dependencies come from the venv).
"$PYTHON" -m pip install --quiet --no-deps --no-build-isolation --target "$WORK/site" "$REPO" >&2

"$PYTHON" -m PyInstaller \
    --onedir \
    --contents-directory agent-lib \
    --name agent \
    --noconfirm \
    --clean \
    --log-level WARN \
    --paths "$WORK/site" \
    --collect-submodules pko.agent \
    --collect-submodules pko.api \
    --exclude-module kubernetes_asyncio \
    --exclude-module aiohttp \
    --exclude-module pko.controllers \
    --exclude-module mypy \
    --exclude-module hypothesis \
    --collect-submodules pulumi.automation \
    --copy-metadata pulumi \
    --distpath "$OUT" \
    --workpath "$WORK/build" \
    --specpath "$WORK" \
    "$WORK/site/pko/agent/__main__.py" >&2

echo "$OUT/agent/agent"
