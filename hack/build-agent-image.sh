#!/usr/bin/env bash
# Build the agent image as an OCI archive, offline: no Docker engine, no base image, no registry.
#
# Usage: hack/build-agent-image.sh [OUTPUT_DIR]   (default: ~/.cache/pko/images; prints the archive's path)
#
# Environment:
#   PKO_AGENT_BINARY  a prebuilt agent executable (hack/build-agent.sh output, `agent-lib/` beside it);
#                     built here when unset
#   PKO_AGENT_IMAGE   the image name recorded in the archive (default docker.io/library/pko-agent:dev,
#                     which is what a pod's `image: pko-agent:dev` resolves to)
#
# The archive (oci-layout, index.json, blobs) is what a node's containerd imports with
# `ctr -n k8s.io images import`. The image is FROM scratch with exactly the layout agent/Dockerfile
# produces for CI with a registry; keep the two in step (test/agent/test_agent_image.py compares them):
#   /agent        the PyInstaller one-folder agent's executable (it runs later inside the user's
#   /agent-lib/   Pulumi image), and its interpreter and dependencies
#   /tini         Debian's tini-static
#   /bin/busybox  Debian's busybox-static, with /bin/cp -> busybox: the workspace pod's `bootstrap`
#                 init container runs this image with args `cp -r /agent /agent-lib /tini /share/`
#                 (the Go operator's `cp /agent /tini /share/`, plus the folder; its distroless:debug
#                 base has busybox for the same reason)
#   ENTRYPOINT ["/tini", "--"], PATH=/bin, USER 65532:65532
# buildah runs with the vfs driver and private, temporary storage, so nothing is cached outside
# OUTPUT_DIR and nothing is left in the repository or in buildah's system storage.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}/images}"
IMAGE="${PKO_AGENT_IMAGE:-docker.io/library/pko-agent:dev}"
ARCHIVE="$OUT/pko-agent.oci.tar"

# Debian packages this needs: buildah (builder), tini (tini-static), busybox-static (cp).
missing=()
command -v buildah >/dev/null || missing+=(buildah)
[ -x /usr/bin/tini-static ] || missing+=(tini)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' || missing+=(busybox-static)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "build-agent-image: installing ${missing[*]}" >&2
    exec 8>"${TMPDIR:-/tmp}/pko-apt.lock"; flock 8   # one apt at a time (pko/devtools/localcluster.py's lock)
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    exec 8>&-
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/pko-agent-image.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

AGENT="${PKO_AGENT_BINARY:-}"
if [ -z "$AGENT" ]; then
    AGENT="$(bash "$REPO/hack/build-agent.sh" "$WORK/agent-bin" | tail -n 1)"
fi
[ -x "$AGENT" ] && [ -d "$(dirname "$AGENT")/agent-lib" ] || {
    echo "build-agent-image: no executable agent with agent-lib/ beside it at '$AGENT'" >&2; exit 1; }

ROOTFS="$WORK/rootfs"
install -D -m 0755 "$AGENT" "$ROOTFS/agent"
cp -r "$(dirname "$AGENT")/agent-lib" "$ROOTFS/agent-lib"
install -D -m 0755 /usr/bin/tini-static "$ROOTFS/tini"
install -D -m 0755 /bin/busybox "$ROOTFS/bin/busybox"
ln -s busybox "$ROOTFS/bin/cp"
# glibc for the (dynamically linked) PyInstaller agent, which the `fetch` init container runs here.
install -D -m 0755 /lib64/ld-linux-x86-64.so.2 "$ROOTFS/lib64/ld-linux-x86-64.so.2"
for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libz.so.1 libgcc_s.so.1; do
    install -D -m 0755 "/lib/x86_64-linux-gnu/$lib" "$ROOTFS/lib/x86_64-linux-gnu/$lib"
done
install -d -m 1777 "$ROOTFS/tmp"

mkdir -p "$WORK/tmp"
bah() {
    TMPDIR="$WORK/tmp" buildah --storage-driver vfs --root "$WORK/storage" --runroot "$WORK/run" "$@"
}
ctr="$(bah from --quiet scratch)"
bah copy --quiet "$ctr" "$ROOTFS/" / >/dev/null
bah config \
    --entrypoint '["/tini", "--"]' \
    --cmd '["/agent", "serve", "--workspace", "/share/workspace"]' \
    --env PATH=/bin \
    --user 65532:65532 \
    "$ctr"
bah commit --quiet "$ctr" "$IMAGE" >/dev/null
mkdir -p "$OUT"
rm -f "$ARCHIVE.partial"
bah push --quiet "$IMAGE" "oci-archive:$ARCHIVE.partial:$IMAGE"
mv -f "$ARCHIVE.partial" "$ARCHIVE"  # readers never see a half-written archive
echo "$ARCHIVE"
