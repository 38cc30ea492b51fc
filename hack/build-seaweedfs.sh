#!/usr/bin/env bash
# Build SeaweedFS, the S3-compatible object store config/samples/s3 keeps Pulumi state in, at the version
# pinned in hack/versions.env (SEAWEEDFS_*), cached outside the repo. A file backend on a node-local volume
# pins a stack to one node; an object store served in the cluster does not, and `s3://` is the backend
# production users pick. No image registry is reachable here, so the server is built from its Go module
# and packaged as an image the node imports, as everything else the node runs.
#
# How: upstream's own build of its `weed` command (./weed of github.com/seaweedfs/seaweedfs, go.mod and
# go.sum unchanged, every dependency from the Go module proxy through hack/gomod.sh's environment: CGO
# off, no toolchain switch), static and stripped (-trimpath -ldflags "-s -w"), with upstream's commit stamp
# (-X .../weed/util/version.COMMIT, as its docker/Dockerfile.go_build sets). The module is served only as
# a pseudo-version; `go install module@version` refuses it (its go.mod has a replace), so it is built in a
# writable copy. About 7 min cold on 2 shared cores (426 s for `weed`, its dependencies downloaded with it).
#
# Usage: hack/build-seaweedfs.sh [IMAGES_DIR]
#   build (idempotent: a second run with the same pins prints the directory at once); logs each step's
#   time on stderr and prints the output directory last:
#     ${PKO_CACHE_DIR:-~/.cache/pko}/seaweedfs-<version>-<digest of the pins>/dist, which holds
#       bin/weed                  the server (master, volume, filer and S3 gateway in one binary)
#       pko-seaweedfs.oci.tar     its image, localhost/pko-seaweedfs:dev: from scratch, /usr/bin/weed,
#                                 Debian's tini-static as PID 1 (weed as PID 1 would not get SIGTERM's
#                                 default action) and busybox-static with its applets (for `kubectl exec`),
#                                 world-writable /data and /tmp, ENTRYPOINT tini -- weed, CMD mini -dir=/data,
#                                 USER 65532:65532 (numeric: the kubelet can check runAsNonRoot, so it
#                                 runs under the `restricted` Pod Security Standard)
#   and copies the archive to IMAGES_DIR (default ${PKO_CACHE_DIR:-~/.cache/pko}/images, where
#   `hack/localnode.py up` imports every *.oci.tar unless told which: hack/test.sh's and e2e/'s node
#   does, hack/up.sh's only with `hack/up.sh s3`) as pko-seaweedfs.oci.tar, with pko-seaweedfs.hash
#   naming the build (hack/build-images.sh's convention). Built with buildah, vfs storage under the
#   build's directory, nothing kept. `hack/build-images.sh s3` runs it (installing buildah first if
#   needed) and prints the archive's path.
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-seaweedfs.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"

log() { echo "build-seaweedfs: $(date +%T) $*" >&2; }
die() { echo "build-seaweedfs: $*" >&2; exit 1; }

[ $# -le 1 ] || die "usage: hack/build-seaweedfs.sh [IMAGES_DIR]"
IMAGES="${1:-$CACHE_ROOT/images}"

MODULE=github.com/seaweedfs/seaweedfs
# The cache key: the version, and a digest of the pins and of this recipe's revision (bump v1 when the way
# it builds changes).
pins="seaweedfs $SEAWEEDFS_VERSION $MODULE $SEAWEEDFS_MODULE_VERSION"
KEY="seaweedfs-${SEAWEEDFS_VERSION}-$(sha256sum <<<"$pins v1" | cut -c1-10)"
OUT="$CACHE_ROOT/$KEY"
DIST="$OUT/dist"
IMAGE=localhost/pko-seaweedfs:dev
ARCHIVE=pko-seaweedfs.oci.tar

have_all() { [ -x "$DIST/bin/weed" ] && [ -f "$DIST/$ARCHIVE" ]; }
# install_image: the archive where the node imports it, unless that copy is already this build's.
install_image() {
    [ -f "$IMAGES/$ARCHIVE" ] && [ "$(cat "$IMAGES/pko-seaweedfs.hash" 2>/dev/null)" = "$KEY" ] && return 0
    mkdir -p "$IMAGES"
    cp "$DIST/$ARCHIVE" "$IMAGES/$ARCHIVE.partial"
    mv -f "$IMAGES/$ARCHIVE.partial" "$IMAGES/$ARCHIVE"
    echo "$KEY" >"$IMAGES/pko-seaweedfs.hash"
    log "installed $IMAGES/$ARCHIVE"
}
if have_all; then install_image; echo "$DIST"; exit 0; fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-seaweedfs.lock"
flock 9
if have_all; then install_image; echo "$DIST"; exit 0; fi

for need in buildah /usr/bin/tini-static /bin/busybox; do
    command -v "$need" >/dev/null || [ -x "$need" ] \
        || die "$need is missing (Debian packages buildah, tini, busybox-static; hack/build-images.sh installs them)"
done

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

step "module $MODULE@$SEAWEEDFS_MODULE_VERSION"
gomod_copy "$MODULE" "$SEAWEEDFS_MODULE_VERSION" "$WORK"
took

# The pseudo-version names a commit, not a release: check the release number the pin is named after is the
# one that commit reports, so a new pin cannot keep an old name (and cache key) by mistake.
constants="$WORK/weed/util/version/constants.go"
major="${SEAWEEDFS_VERSION%%.*}" minor="${SEAWEEDFS_VERSION#*.}"
grep -q "MAJOR_VERSION  *= int32($major)" "$constants" && grep -q "MINOR_VERSION  *= int32($((10#$minor)))" "$constants" \
    || die "$MODULE@$SEAWEEDFS_MODULE_VERSION is not release $SEAWEEDFS_VERSION ($constants says otherwise): fix SEAWEEDFS_VERSION"
grep -q '^[[:space:]]*COMMIT[[:space:]]*= ""' "$constants" \
    || die "$constants has no COMMIT variable: upstream's commit stamp moved"

step "weed $SEAWEEDFS_VERSION (./weed)"
# The pseudo-version's last field is the commit's first 12 digits: the stamp upstream's image build sets
# (`weed version` prints it).
(cd "$WORK" && go build -trimpath \
    -ldflags "-s -w -X $MODULE/weed/util/version.COMMIT=${SEAWEEDFS_MODULE_VERSION##*-}" \
    -o "$NEW/bin/weed" ./weed)
"$NEW/bin/weed" version >&2
took

step "image $IMAGE"
ROOTFS="$OUT/rootfs"
rm -rf "$ROOTFS" "$OUT/buildah"
install -D -m 0755 "$NEW/bin/weed" "$ROOTFS/usr/bin/weed"
install -D -m 0755 /usr/bin/tini-static "$ROOTFS/tini"
install -D -m 0755 /bin/busybox "$ROOTFS/bin/busybox"
for applet in $(/bin/busybox --list); do [ "$applet" = busybox ] || ln -s busybox "$ROOTFS/bin/$applet"; done
# World-writable (sticky, as /tmp): the server runs as whatever non-root uid a cluster assigns (65532 by
# default, OpenShift's arbitrary ones), and without a volume mounted at /data it writes there.
install -d -m 1777 "$ROOTFS/tmp" "$ROOTFS/data"
mkdir -p "$OUT/buildah/tmp"
bah() { TMPDIR="$OUT/buildah/tmp" buildah --storage-driver vfs --root "$OUT/buildah/root" --runroot "$OUT/buildah/run" "$@"; }
ctr="$(bah from --quiet scratch)"
bah copy --quiet "$ctr" "$ROOTFS/" / >/dev/null
bah config --entrypoint '["/tini", "--", "weed"]' --cmd '["mini", "-dir=/data"]' \
    --env PATH=/usr/bin:/bin --env HOME=/tmp --workingdir /data --user 65532:65532 \
    --port 8333 --port 8888 --port 9333 "$ctr"
bah commit --quiet "$ctr" "$IMAGE" >/dev/null
bah push --quiet "$IMAGE" "oci-archive:$NEW/$ARCHIVE:$IMAGE"
rm -rf "$ROOTFS" "$OUT/buildah"
took

rm -rf "$DIST" "$WORK"
mv "$NEW" "$DIST"
install_image
log "done in $((SECONDS - total_start)) s"
echo "$DIST"
