#!/usr/bin/env bash
# Create or refresh .venv with pko and its dev extras. Re-installs only when pyproject.toml or a lock
# (requirements.lock, requirements-build.lock: hack/lock.sh) changes. Prints the venv's python on stdout.
#
# The locked packages go in first, hash-checked, so the venv's runtime packages and PyInstaller are the
# ones the images get (hack/build-agent.sh bundles the agent from this venv); the dev extras come after,
# constrained to the locks' versions, so that pip cannot move a locked package to satisfy a dev tool.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${PKO_VENV:-$REPO/.venv}"
PY="${PYTHON:-python3}"
LOCKS=("$REPO/requirements.lock" "$REPO/requirements-build.lock")
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >&2
  fi
  "$PY" -m venv "$VENV" >&2
fi
# One install at a time: helpers and test runs call this concurrently on the shared venv.
exec 9>"$VENV/.pko-deps.lock"
flock 9
want="$(cat "$REPO/pyproject.toml" "${LOCKS[@]}" | sha256sum | cut -d' ' -f1)"
have="$(cat "$VENV/.pko-deps" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
  rm -f "$VENV/.pko-deps"
  pip=("$VENV/bin/pip" install -q --disable-pip-version-check)
  "${pip[@]}" -U pip >&2
  for lock in "${LOCKS[@]}"; do
    "${pip[@]}" --require-hashes --no-deps -r "$lock" >&2
  done
  # The locks' pins without their hashes (a hash anywhere puts pip in hash-checking mode, which refuses
  # the editable install).
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  sed -n 's/^\([A-Za-z0-9._-]*==[^ ;\\]*\).*/\1/p' "${LOCKS[@]}" > "$constraints"
  "${pip[@]}" -e "$REPO[dev]" -c "$constraints" >&2
  echo "$want" > "$VENV/.pko-deps"
fi
echo "$VENV/bin/python"
