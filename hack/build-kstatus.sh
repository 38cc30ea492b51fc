#!/usr/bin/env bash
# Build hack/kstatus (a small program over sigs.k8s.io/cli-utils' kstatus, the library Flux's health checks
# and kpt judge resources with; its version is pinned in hack/kstatus/go.mod, every module from the Go
# module proxy through hack/gomod.sh's environment), cached outside the repo under a key of its sources.
#
# Usage: hack/build-kstatus.sh   build (idempotent; prints the output directory last:
#   ${PKO_CACHE_DIR:-~/.cache/pko}/kstatus-<digest of hack/kstatus>/dist, which holds bin/kstatus)
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-kstatus.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/gotool.sh
. "$REPO/hack/gotool.sh"
[ $# -eq 0 ] || die "usage: hack/build-kstatus.sh"

SRC="$REPO/hack/kstatus"
cache_root="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
OUT="$cache_root/kstatus-$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-10)"
if [ -x "$OUT/dist/bin/kstatus" ]; then echo "$OUT/dist"; exit 0; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-kstatus.lock"
flock 9
if [ -x "$OUT/dist/bin/kstatus" ]; then echo "$OUT/dist"; exit 0; fi
# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env
export GOFLAGS="-mod=readonly -buildvcs=false"   # go.sum as committed: no module changes here
step "kstatus ($(grep 'sigs.k8s.io/cli-utils ' "$SRC/go.mod" | xargs))"
rm -rf "$OUT/dist.partial"
mkdir -p "$OUT/dist.partial/bin"
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/dist.partial/bin/kstatus" .)
took
rm -rf "$OUT/dist"
mv "$OUT/dist.partial" "$OUT/dist"
echo "$OUT/dist"
