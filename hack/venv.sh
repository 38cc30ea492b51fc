#!/usr/bin/env bash
# Create or refresh .venv with pko and its dev extras. Re-installs only when pyproject.toml changes.
# Prints the venv's python on stdout.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${PKO_VENV:-$REPO/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >&2
  fi
  "$PY" -m venv "$VENV" >&2
fi
want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
have="$(cat "$VENV/.pko-deps" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
  "$VENV/bin/pip" install -q --disable-pip-version-check -U pip >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$REPO[dev]" >&2
  echo "$want" > "$VENV/.pko-deps"
fi
echo "$VENV/bin/python"
