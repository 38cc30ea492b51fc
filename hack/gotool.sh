# The frame every "one Go tool from its module, at the pin of hack/versions.env" build shares
# (hack/build-helm.sh, hack/build-registry.sh): the cache key, the lock, the work directories, step
# timing, and the move into place that makes a half-built tool invisible. Sourced, after versions.env:
#
#   gotool_begin KEY_NAME PIN_NAME VERSION MODULE BINARY...
#       prints the cached output directory and exits when every BINARY is built; else takes the lock,
#       sets the Go module environment (hack/gomod.sh) and copies MODULE@vVERSION into $WORK, writable
#   ... the tool's own checks in $WORK, and `go build -o "$NEW/bin/BINARY"` ...
#   gotool_finish   moves $NEW into place as $DIST and prints it
#
# The output directory: ${PKO_CACHE_DIR:-~/.cache/pko}/KEY_NAME-VERSION-<digest of the pin>/dist, the digest
# over "PIN_NAME VERSION MODULE" and the recipe's revision (v1: bump when the way the tools build changes).
# Each script's `log`/`die` name it (build-helm: ...).

log() { echo "$(basename "$0" .sh): $(date +%T) $*" >&2; }
die() { echo "$(basename "$0" .sh): $*" >&2; exit 1; }
step_start=0
step() { log "$*"; step_start=$SECONDS; }
took() { log "  took $((SECONDS - step_start)) s"; }

gotool_begin() {
    local key_name="$1" pin_name="$2" pin="$3"
    MODULE="$4"
    shift 4
    GOTOOL_BINARIES=("$@")
    VERSION="v$pin"
    local cache_root="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
    OUT="$cache_root/$key_name-$pin-$(sha256sum <<<"$pin_name $pin $MODULE v1" | cut -c1-10)"
    DIST="$OUT/dist"
    if _gotool_built; then echo "$DIST"; exit 0; fi
    mkdir -p "$cache_root"
    exec 9>"$cache_root/.build-$key_name.lock"
    flock 9
    if _gotool_built; then echo "$DIST"; exit 0; fi
    # shellcheck source=hack/gomod.sh
    . "$(dirname "${BASH_SOURCE[0]}")/gomod.sh"
    gomod_env
    WORK="$OUT/src"
    NEW="$OUT/dist.partial"
    rm -rf "$WORK" "$NEW"
    mkdir -p "$NEW/bin"
    GOTOOL_START=$SECONDS
    step "module $MODULE@$VERSION"
    gomod_copy "$MODULE" "$VERSION" "$WORK"
    took
}

_gotool_built() {
    local binary
    for binary in "${GOTOOL_BINARIES[@]}"; do [ -x "$DIST/bin/$binary" ] || return 1; done
}

gotool_finish() {
    rm -rf "$DIST" "$WORK"
    mv "$NEW" "$DIST"
    log "done in $((SECONDS - GOTOOL_START)) s"
    echo "$DIST"
}
