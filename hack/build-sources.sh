#!/usr/bin/env bash
# Build what the Go module proxy refuses, from upstream source pinned in hack/versions.env, cached outside
# the repo under a key of its own (the engine of hack/build-pulumi.sh is not rebuilt for it):
#   pulumi-resource-random   pulumi-random  provider/ ./cmd/pulumi-resource-random  (PULUMI_RANDOM_*)
#   pulumi-resource-command  pulumi-command provider/ ./cmd/pulumi-resource-command (PULUMI_COMMAND_*)
#   pulumi-language-nodejs, pulumi-language-go   pulumi/pulumi's nested host modules (PULUMI_LANGUAGE_HOSTS_*)
# and fetches, verified the same way, the pinned sources other scripts build (not part of this build, its
# cache key or its outputs):
#   operator   the Go Pulumi Kubernetes Operator (PULUMI_KUBERNETES_OPERATOR_*), built by hack/build-peer.sh
#
# Where the source comes from: an archive in $PKO_SOURCES (default: ../shared/sources beside the repo,
# when that directory exists), named after the repository and the pinned ref (pulumi-random-v<version>.tar.gz,
# pulumi-yaml-<commit:12>.tar.gz, ...), whose sha256 must equal the pin: a mismatch is refused, never
# built. Without the archive, the pinned ref is cloned from its public repository (a tag with
# `git clone --depth 1 --branch`, a bare commit with `git fetch --depth 1`) and HEAD must be the pinned
# commit. Either way the source is extracted into the cache's scratch directory, never into the repo.
#
# How (measured, see docs/development.md, "Providers and language hosts built from pinned source"):
#  - pulumi-random: the bridge requires pulumi-yaml and pulumi-dotnet's language host at pseudo-versions
#    the proxy refuses; the pinned archives of exactly those commits are used through local `replace`
#    directives (go.sum unchanged). The embedded schema is generated first (`go generate`, as upstream).
#  - pulumi-command builds unchanged.
#  - the Node.js and Go hosts: each nested go.mod replaces sdk/v3 and pkg/v3 with monorepo paths; the
#    replaces are dropped and the served modules of the same tag required instead.
#  - the providers are installed as build-pulumi.sh installs kubernetes, with the engine's own CLI:
#    `pulumi plugin install resource NAME VERSION --file BINARY`.
#
# Usage: hack/build-sources.sh          build (idempotent: a second run with the same pins takes no time);
#                                       prints the output directory last, which holds
#            bin/       pulumi-language-nodejs, pulumi-language-go (beside `pulumi` in an image), and the
#                       Node.js dynamic-provider shim pulumi-resource-pulumi-nodejs (the tag's sdk/nodejs/dist)
#            plugins/   a $PULUMI_HOME/plugins tree: resource-random-v<version>, resource-command-v<version>
#        hack/build-sources.sh verify   check every archive present in the sources directory against its
#                                       pin, build nothing (exit 1 naming the archive on a mismatch)
#        hack/build-sources.sh get ID DEST
#                                       the pinned source ID (random, ..., hosts, operator) at DEST, which
#                                       is replaced: the repository's root, from the verified archive or a
#                                       verified clone; builds nothing
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-sources.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
SOURCES="${PKO_SOURCES:-}"
if [ -z "$SOURCES" ] && [ -d "$REPO/../shared/sources" ]; then SOURCES="$(cd "$REPO/../shared/sources" && pwd)"; fi

log() { echo "build-sources: $(date +%T) $*" >&2; }
die() { echo "build-sources: $*" >&2; exit 1; }

# The pinned sources, by id: SOURCE_IDS are those this script builds (its cache key digests their pins);
# OTHER_IDS are fetched for other scripts (`get`) and checked by `verify`.
SOURCE_IDS="random random-yaml random-dotnet command hosts"
OTHER_IDS="operator"
# source_pin ID: sets ARCHIVE, REPOSITORY, REF, COMMIT, SHA256, PIN (the versions.env prefix).
source_pin() {
    case "$1" in
        random)        PIN=PULUMI_RANDOM; REF="v$PULUMI_RANDOM_VERSION"; ARCHIVE="pulumi-random-$REF.tar.gz" ;;
        random-yaml)   PIN=PULUMI_RANDOM_YAML; REF="$PULUMI_RANDOM_YAML_COMMIT"; ARCHIVE="pulumi-yaml-${REF:0:12}.tar.gz" ;;
        random-dotnet) PIN=PULUMI_RANDOM_DOTNET; REF="$PULUMI_RANDOM_DOTNET_COMMIT"; ARCHIVE="pulumi-dotnet-${REF:0:12}.tar.gz" ;;
        command)       PIN=PULUMI_COMMAND; REF="v$PULUMI_COMMAND_VERSION"; ARCHIVE="pulumi-command-$REF.tar.gz" ;;
        hosts)         PIN=PULUMI_LANGUAGE_HOSTS; REF="v$PULUMI_LANGUAGE_HOSTS_VERSION"; ARCHIVE="pulumi-$REF-language-hosts.tar.gz" ;;
        operator)      PIN=PULUMI_KUBERNETES_OPERATOR; REF="v$PULUMI_KUBERNETES_OPERATOR_VERSION"; ARCHIVE="pulumi-kubernetes-operator-$REF.tar.gz" ;;
        *) die "no source named $1" ;;
    esac
    local repository="${PIN}_REPOSITORY" commit="${PIN}_COMMIT" sha="${PIN}_SHA256"
    REPOSITORY="${!repository}"; COMMIT="${!commit}"; SHA256="${!sha}"
}

# sources_verify FILE SHA256 [PIN]: the file's sha256 is the pinned one, or exit 1 saying which differs.
sources_verify() {
    local actual
    actual="$(sha256sum "$1" | cut -d' ' -f1)"
    [ "$actual" = "$2" ] && return 0
    die "sha256 mismatch: $1 has sha256 $actual, but hack/versions.env pins ${3:+$3_SHA256=}$2; refusing to build from it (replace the archive, or remove it to clone the pinned ref)"
}

# source_get ID DEST: the pinned source at DEST (the repository's root), from the verified archive or a
# verified clone.
source_get() {
    source_pin "$1"
    rm -rf "$2"; mkdir -p "$2"
    if [ -n "$SOURCES" ] && [ -f "$SOURCES/$ARCHIVE" ]; then
        sources_verify "$SOURCES/$ARCHIVE" "$SHA256" "$PIN"
        tar -xzf "$SOURCES/$ARCHIVE" -C "$2" --strip-components=1 --no-same-owner
        log "$1: $ARCHIVE (sha256 verified)"
        return 0
    fi
    command -v git >/dev/null || die "$ARCHIVE is not in ${SOURCES:-PKO_SOURCES (unset)} and git is missing to clone $REPOSITORY"
    log "$1: cloning $REPOSITORY at $REF (no $ARCHIVE in ${SOURCES:-PKO_SOURCES (unset)})"
    if [ "$REF" = "$COMMIT" ]; then
        git init -q "$2"
        git -C "$2" fetch -q --depth 1 "$REPOSITORY" "$COMMIT"
        git -C "$2" -c advice.detachedHead=false checkout -q FETCH_HEAD
    else
        git -c advice.detachedHead=false clone -q --depth 1 --branch "$REF" "$REPOSITORY" "$2"
    fi
    local head
    head="$(git -C "$2" rev-parse HEAD)"
    [ "$head" = "$COMMIT" ] || die "$REPOSITORY $REF is commit $head, but hack/versions.env pins ${PIN}_COMMIT=$COMMIT; refusing to build from it"
    rm -rf "$2/.git"
}

verify_all() {
    [ -n "$SOURCES" ] && [ -d "$SOURCES" ] || die "no sources directory (PKO_SOURCES, or ../shared/sources beside the repo)"
    local id
    for id in $SOURCE_IDS $OTHER_IDS; do
        source_pin "$id"
        if [ -f "$SOURCES/$ARCHIVE" ]; then
            sources_verify "$SOURCES/$ARCHIVE" "$SHA256" "$PIN"
            echo "$ARCHIVE: ok"
        else
            echo "$ARCHIVE: absent (the build clones $REPOSITORY at $REF)"
        fi
    done
}

USAGE="usage: hack/build-sources.sh [verify | get ID DEST]"
case "${1:-}" in
    verify) [ $# -eq 1 ] || die "$USAGE"; verify_all; exit 0 ;;
    get)
        [ $# -eq 3 ] && [ -n "$3" ] || die "$USAGE"
        source_pin "$2"  # an unknown ID fails here, before DEST is touched
        source_get "$2" "$3"
        exit 0
        ;;
esac
[ $# -eq 0 ] || die "$USAGE"

# The cache key: the versions, and a digest of every pin (a new commit or archive means a new build).
pins="$(for id in $SOURCE_IDS; do source_pin "$id"; echo "$id $REF $COMMIT $SHA256"; done)"
KEY="sources-random-${PULUMI_RANDOM_VERSION}-command-${PULUMI_COMMAND_VERSION}-hosts-${PULUMI_LANGUAGE_HOSTS_VERSION}-$(sha256sum <<<"$pins v1" | cut -c1-10)"
OUT="$CACHE_ROOT/$KEY"
DIST="$OUT/dist"
BINARIES="bin/pulumi-language-nodejs bin/pulumi-language-go bin/pulumi-resource-pulumi-nodejs
plugins/resource-random-v${PULUMI_RANDOM_VERSION}/pulumi-resource-random
plugins/resource-command-v${PULUMI_COMMAND_VERSION}/pulumi-resource-command"

have_all() { for b in $BINARIES; do [ -x "$DIST/$b" ] || return 1; done; }
if have_all; then echo "$DIST"; exit 0; fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-sources.lock"
flock 9
if have_all; then echo "$DIST"; exit 0; fi

# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env

WORK="$OUT/src"
NEW="$OUT/dist.partial"
rm -rf "$WORK" "$NEW"
mkdir -p "$WORK" "$NEW/bin"

gobuild() {  # DIR OUTPUT PACKAGE TAGS LDFLAGS
    (cd "$1" && go build -trimpath -tags "$4" -ldflags "-s -w $5" -o "$2" "$3")
}

step_start=0
step() { log "$*"; step_start=$SECONDS; }
took() { log "  took $((SECONDS - step_start)) s"; }

step "pulumi-resource-random v$PULUMI_RANDOM_VERSION"
source_get random "$WORK/pulumi-random"
source_get random-yaml "$WORK/pulumi-yaml"
source_get random-dotnet "$WORK/pulumi-dotnet"
RANDOM_DIR="$WORK/pulumi-random/provider"
(cd "$RANDOM_DIR" && go mod edit \
    -replace "github.com/pulumi/pulumi-yaml=$WORK/pulumi-yaml" \
    -replace "github.com/pulumi/pulumi-dotnet/pulumi-language-dotnet/v3=$WORK/pulumi-dotnet/pulumi-language-dotnet")
(cd "$RANDOM_DIR/cmd/pulumi-resource-random" && VERSION="$PULUMI_RANDOM_VERSION" go generate ./main.go)
gobuild "$RANDOM_DIR" "$WORK/pulumi-resource-random" ./cmd/pulumi-resource-random "" \
    "-X github.com/pulumi/pulumi-random/provider/v4/pkg/version.Version=$PULUMI_RANDOM_VERSION"
took

step "pulumi-resource-command v$PULUMI_COMMAND_VERSION"
source_get command "$WORK/pulumi-command"
# Upstream's release stamps the tag (v-prefixed); main.go trims the v.
gobuild "$WORK/pulumi-command/provider" "$WORK/pulumi-resource-command" ./cmd/pulumi-resource-command "" \
    "-X github.com/pulumi/pulumi-command/provider/pkg/version.Version=v$PULUMI_COMMAND_VERSION"
took

source_get hosts "$WORK/pulumi-hosts"
HOSTS_LDFLAGS="-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$PULUMI_LANGUAGE_HOSTS_VERSION"
for host in nodejs:sdk/nodejs/cmd/pulumi-language-nodejs go:sdk/go/pulumi-language-go; do
    step "pulumi-language-${host%%:*} v$PULUMI_LANGUAGE_HOSTS_VERSION"
    dir="$WORK/pulumi-hosts/${host#*:}"
    (cd "$dir" && go mod edit \
        -dropreplace github.com/pulumi/pulumi/sdk/v3 -dropreplace github.com/pulumi/pulumi/pkg/v3 \
        -require "github.com/pulumi/pulumi/sdk/v3@v$PULUMI_LANGUAGE_HOSTS_VERSION" \
        -require "github.com/pulumi/pulumi/pkg/v3@v$PULUMI_LANGUAGE_HOSTS_VERSION")
    gobuild "$dir" "$NEW/bin/pulumi-language-${host%%:*}" . osusergo,grpcnotrace "$HOSTS_LDFLAGS"
    took
done
install -m 0755 "$WORK/pulumi-hosts/sdk/nodejs/dist/pulumi-resource-pulumi-nodejs" "$NEW/bin/"

# Install each provider with the engine's CLI, as build-pulumi.sh installs kubernetes (it prints the
# engine's directory; it is built once per version and returns at once when it exists).
ENGINE="$(bash "$REPO/hack/build-pulumi.sh" | tail -n 1)"
for provider in "random $PULUMI_RANDOM_VERSION" "command $PULUMI_COMMAND_VERSION"; do
    read -r name version <<<"$provider"
    PULUMI_HOME="$NEW/home" PULUMI_SKIP_UPDATE_CHECK=true "$ENGINE/bin/pulumi" plugin install resource "$name" "$version" \
        --file "$WORK/pulumi-resource-$name" >&2
done
mv "$NEW/home/plugins" "$NEW/plugins"
rm -rf "$NEW/home"
PULUMI_HOME="$NEW" PULUMI_SKIP_UPDATE_CHECK=true "$ENGINE/bin/pulumi" plugin ls >&2

rm -rf "$DIST" "$WORK"
mv "$NEW" "$DIST"
log "done"
echo "$DIST"
