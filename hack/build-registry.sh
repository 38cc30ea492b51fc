#!/usr/bin/env bash
# Build the CNCF Distribution registry (`registry`, the server behind Docker Hub's and most private
# registries) at the version pinned in hack/versions.env (DISTRIBUTION_VERSION), cached outside the repo.
# hack/registry.py runs it as a private registry is run (TLS, htpasswd, filesystem storage), so the images
# the node pulls come over the same protocol, with the same auth, as from a user's registry.
#
# How: upstream's own build of ./cmd/registry (github.com/distribution/distribution/v3, go.mod and go.sum
# unchanged, every dependency from the Go module proxy through hack/gomod.sh's environment: CGO off, no
# toolchain switch), static and stripped (-trimpath -ldflags "-s -w"), with the stamps upstream's Dockerfile
# sets (version.version without the leading v, version.mainpkg; `registry --version` prints them). Built in
# a writable copy of the module, as upstream builds it from its own tree.
#
# Usage: hack/build-registry.sh   build (idempotent: a second run with the same pin prints the directory at
#                                 once); logs each step's time on stderr and prints the output directory last:
#   ${PKO_CACHE_DIR:-~/.cache/pko}/registry-<version>-<digest of the pin>/dist, which holds
#     bin/registry   the registry server
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-registry.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
# shellcheck source=hack/gotool.sh
. "$REPO/hack/gotool.sh"

[ $# -eq 0 ] || die "usage: hack/build-registry.sh"

# The module path carries its major version (v3 for 3.x).
gotool_begin registry distribution "$DISTRIBUTION_VERSION" "github.com/distribution/distribution/v${DISTRIBUTION_VERSION%%.*}" registry

# A -X for a variable that is not there is silently ignored: check the stamps' variables exist, and that the
# module's own default version names the pin, so a wrong pin cannot pass for a right one.
version_go="$WORK/version/version.go"
grep -q "^var version = \"$VERSION+unknown\"$" "$version_go" \
    || die "$MODULE@$VERSION: $version_go does not name $VERSION: upstream's version stamp moved"
grep -q '^var mainpkg = ' "$version_go" || die "$MODULE@$VERSION: $version_go has no mainpkg: upstream's stamp moved"

step "registry $VERSION (./cmd/registry)"
stamps="-X $MODULE/version.version=$DISTRIBUTION_VERSION -X $MODULE/version.mainpkg=$MODULE"
(cd "$WORK" && go build -trimpath -ldflags "-s -w $stamps" -o "$NEW/bin/registry" ./cmd/registry)
# `registry --version` prints "<argv0> <mainpkg> <version>".
reported="$("$NEW/bin/registry" --version)"
[[ "$reported" == *" $MODULE $DISTRIBUTION_VERSION" ]] \
    || die "the built registry says '$reported', not $MODULE $DISTRIBUTION_VERSION"
log "registry ${reported#* }"
took

gotool_finish
