#!/usr/bin/env bash
# ruff on the whole tree, mypy --strict on the `pko` namespace (pko/, api/ -> pko.api, agent/ -> pko.agent).
#
# mypy cannot follow setuptools' package-dir mapping, so it checks a symlink farm that lays the
# namespace out as it is installed: <tmp>/pko -> pko/ with api/ and agent/ linked in.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="$(bash "$REPO/hack/venv.sh")"
BIN="$(dirname "$PY")"
cd "$REPO"
"$BIN/ruff" check .
FARM="$(mktemp -d)"; trap 'rm -rf "$FARM"' EXIT
mkdir "$FARM/pko"
for f in "$REPO"/pko/*; do ln -s "$f" "$FARM/pko/$(basename "$f")"; done
ln -s "$REPO/api" "$FARM/pko/api"
ln -s "$REPO/agent" "$FARM/pko/agent"
( cd "$FARM" && "$BIN/mypy" --config-file "$REPO/pyproject.toml" --cache-dir "${PKO_MYPY_CACHE:-$REPO/.mypy_cache}" -p pko ) \
  | sed "s#^pko/api/#api/#; s#^pko/agent/#agent/#"
test "${PIPESTATUS[0]}" -eq 0
