#!/usr/bin/env bash
# Build the Go Pulumi Kubernetes Operator, the upstream project pko re-implements, at the version pinned in
# hack/versions.env (PULUMI_KUBERNETES_OPERATOR_*), cached outside the repo. Users weigh pko against the Go
# operator (same CRDs, same workspace agent protocol), so the comparison runs both on the same node; the Go
# module proxy refuses the operator's module, so it is built from its pinned source, which
# `hack/build-sources.sh get operator` fetches and verifies (the archive in $PKO_SOURCES, default
# ../shared/sources, sha256-checked against the pin, else a clone of the tag checked against the commit).
#
# How: upstream's own build of one root module (go.mod, go.sum unchanged), with every dependency from the Go
# module proxy (hack/gomod.sh's environment: CGO off, no toolchain switch), upstream's version stamps:
#   manager  ./operator/cmd/main.go  -X <module>/operator/version.Version=v<version>
#   agent    ./agent/main.go         -X <module>/agent/version.Version=v<version>
# with -trimpath -ldflags "-s -w" (static, stripped, as hack/build-sources.sh builds). About 4 min cold
# for the manager on 2 cores, seconds for the agent after it.
#
# Usage: hack/build-peer.sh   build (idempotent: a second run with the same pins prints the directory at
#                             once); logs each step's time on stderr and prints the output directory last:
#   ${PKO_CACHE_DIR:-~/.cache/pko}/peer-operator-<version>-<digest of the pins>/dist, which holds
#     bin/manager, bin/agent   the operator's two binaries (the manager's image also runs the agent: each
#                              workspace pod copies /agent into a shared volume)
#     config/                  the operator's kustomize tree as upstream ships it (operator/config: crd/,
#                              rbac/, manager/, default/, ...), to install it from its own manifests (its
#                              Stack CRD is about 1.5 MB: server-side apply only)
#     pulumi-kubernetes-operator.oci.tar
#                              its image, shaped like upstream's (Dockerfile: /manager, /agent and tini on
#                              distroless static:debug-nonroot, ENTRYPOINT tini, CMD /manager, uid 65532):
#                              here from scratch with Debian's tini-static and busybox-static with its
#                              applets (the workspace pods' `bootstrap` init container runs
#                              `cp /agent /tini /share/` in it, the `fetch` ones `sh -c`), named docker.io/pulumi/pulumi-kubernetes-operator:v<version>, the
#                              agent image the manager asks for by default; a node imports it with
#                              `ctr images import` (built with buildah, vfs storage, nothing kept)
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-peer.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"

log() { echo "build-peer: $(date +%T) $*" >&2; }
die() { echo "build-peer: $*" >&2; exit 1; }

[ $# -eq 0 ] || die "usage: hack/build-peer.sh"

VERSION="v$PULUMI_KUBERNETES_OPERATOR_VERSION"
# The cache key: the version, and a digest of the pins and of this recipe's revision (bump v1 when the way
# it builds changes).
pins="operator $VERSION $PULUMI_KUBERNETES_OPERATOR_REPOSITORY $PULUMI_KUBERNETES_OPERATOR_COMMIT $PULUMI_KUBERNETES_OPERATOR_SHA256"
KEY="peer-operator-${PULUMI_KUBERNETES_OPERATOR_VERSION}-$(sha256sum <<<"$pins v4" | cut -c1-10)"
OUT="$CACHE_ROOT/$KEY"
DIST="$OUT/dist"

IMAGE="docker.io/pulumi/pulumi-kubernetes-operator:$VERSION"
have_all() {
    [ -x "$DIST/bin/manager" ] && [ -x "$DIST/bin/agent" ] && [ -f "$DIST/config/crd/kustomization.yaml" ] \
        && [ -f "$DIST/pulumi-kubernetes-operator.oci.tar" ]
}
if have_all; then echo "$DIST"; exit 0; fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-peer.lock"
flock 9
if have_all; then echo "$DIST"; exit 0; fi

# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env

WORK="$OUT/src"
NEW="$OUT/dist.partial"
rm -rf "$WORK" "$NEW"
mkdir -p "$NEW/bin"

step_start=0
step() { log "$*"; step_start=$SECONDS; }
took() { log "  took $((SECONDS - step_start)) s"; }
total_start=$SECONDS

step "source $VERSION"
bash "$REPO/hack/build-sources.sh" get operator "$WORK"
took

# The version stamps name packages of the module: a -X for a package that is not linked in is silently
# ignored, so check they are where upstream's build says before relying on them.
MODULE="$(cd "$WORK" && go mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(.*\)"$/\1/p' | head -n 1)"
[ -n "$MODULE" ] || die "no module path in $WORK/go.mod"
for pkg in operator/version agent/version; do
    grep -q '^var Version string' "$WORK/$pkg/version.go" 2>/dev/null \
        || die "$MODULE/$pkg has no Version variable in $VERSION: upstream's version stamp moved"
done

gobuild() {  # OUTPUT PACKAGE VERSION_PACKAGE
    (cd "$WORK" && go build -trimpath -ldflags "-s -w -X $MODULE/$3.Version=$VERSION" -o "$NEW/bin/$1" "$2")
}

step "manager $VERSION (./operator/cmd/main.go)"
gobuild manager ./operator/cmd/main.go operator/version
took

step "agent $VERSION (./agent/main.go)"
gobuild agent ./agent/main.go agent/version
took

step "config (operator/config)"
cp -R "$WORK/operator/config" "$NEW/config"
took

step "image $IMAGE"
for need in buildah /usr/bin/tini-static /bin/busybox; do
    command -v "$need" >/dev/null || [ -x "$need" ] \
        || die "$need is missing (Debian packages buildah, tini, busybox-static; hack/build-images.sh installs them)"
done
ROOTFS="$OUT/rootfs"
rm -rf "$ROOTFS" "$OUT/buildah"
install -D -m 0755 "$NEW/bin/manager" "$ROOTFS/manager"
install -D -m 0755 "$NEW/bin/agent" "$ROOTFS/agent"
install -D -m 0755 /usr/bin/tini-static "$ROOTFS/tini"
install -D -m 0755 /bin/busybox "$ROOTFS/bin/busybox"
# Every busybox applet, as distroless:debug has them: the bootstrap container runs `cp`, the fetch
# containers `sh -c '... && ln -s ...'`.
for applet in $(/bin/busybox --list); do [ "$applet" = busybox ] || ln -s busybox "$ROOTFS/bin/$applet"; done
install -d -m 1777 "$ROOTFS/tmp"
mkdir -p "$OUT/buildah/tmp"
bah() { TMPDIR="$OUT/buildah/tmp" buildah --storage-driver vfs --root "$OUT/buildah/root" --runroot "$OUT/buildah/run" "$@"; }
ctr="$(bah from --quiet scratch)"
bah copy --quiet "$ctr" "$ROOTFS/" / >/dev/null
bah config --entrypoint '["/tini", "--"]' --cmd '["/manager"]' --env PATH=/bin --user 65532:65532 "$ctr"
bah commit --quiet "$ctr" "$IMAGE" >/dev/null
bah push --quiet "$IMAGE" "oci-archive:$NEW/pulumi-kubernetes-operator.oci.tar:$IMAGE"
rm -rf "$ROOTFS" "$OUT/buildah"
took

rm -rf "$DIST" "$WORK"
mv "$NEW" "$DIST"
log "done in $((SECONDS - total_start)) s"
echo "$DIST"
