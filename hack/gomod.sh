#!/usr/bin/env bash
# Go modules from the Go module proxy, one way for every hack/ script: the Go environment the builds use
# and the module files they read. Module and build caches live under the pko cache
# (${PKO_CACHE_DIR:-~/.cache/pko}/go), so one folder holds every slow input; no toolchain switch
# (GOTOOLCHAIN=local: a module's `toolchain` line is only a preference), no go.work, no VCS stamping,
# CGO off (every binary we build is static, as upstream releases them).
#
# Sourced by hack/build-*.sh:
#   gomod_env                      export that environment (fails without Go)
#   gomod_copy MODULE VERSION DEST a writable copy of the module's files at DEST (to build in, with the
#                                  module's own go.mod and go.sum, after editing its replaces)
# Run by hack/*.py:
#   hack/gomod.sh download MODULE VERSION   `go mod download -json` of the module (Dir, Sum, ...),
#                                           downloaded once; exit 1 naming the module when not served
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/gomod.sh: needs bash" >&2; exit 2; fi

gomod_env() {
    local root="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
    export GOMODCACHE="$root/go/mod" GOCACHE="$root/go/build" GOFLAGS="-mod=mod -buildvcs=false"
    export CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GONOSUMDB="" GOPRIVATE=""
    command -v go >/dev/null || { echo "$(basename "$0"): Go is required (go 1.26 or newer)" >&2; return 1; }
}

# gomod_download MODULE VERSION: go's JSON for the module, or exit status 1 with the reason on stderr.
gomod_download() {
    local out err
    err="$(mktemp)"
    # Outside any module: the answer must not depend on the caller's directory.
    if out="$(cd / && go mod download -json "$1@$2" 2>"$err")" && grep -q '"Dir":' <<<"$out"; then
        rm -f "$err"
        printf '%s\n' "$out"
        return 0
    fi
    echo "$(basename "$0"): $1@$2 is not served: $(sed -n 's/^[[:space:]]*"Error": "\(.*\)",*$/\1/p' <<<"$out")$(cat "$err")" >&2
    rm -f "$err"
    return 1
}

gomod_copy() {
    local dir
    dir="$(gomod_download "$1" "$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -n "$dir" ] && [ -f "$dir/go.mod" ] || { echo "$(basename "$0"): no module directory for $1@$2" >&2; exit 1; }
    mkdir -p "$3"
    cp -a "$dir/." "$3/"
    chmod -R u+w "$3"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
        download)
            [ $# -eq 3 ] || { echo "usage: hack/gomod.sh download MODULE VERSION" >&2; exit 2; }
            gomod_env
            gomod_download "$2" "$3"
            ;;
        *)
            echo "usage: hack/gomod.sh download MODULE VERSION   (or source it: gomod_env, gomod_copy)" >&2
            exit 2
            ;;
    esac
fi
