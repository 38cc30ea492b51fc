#!/usr/bin/env bash
# Build every image a local node needs, offline from any image registry, as OCI archives that a node's
# containerd imports (`ctr -n k8s.io images import`):
#
#   localhost/pko-base-python:bookworm  Debian bookworm + python3 (mmdebstrap from Debian packages): the
#                                       PYTHON_IMAGE build argument of the top-level Dockerfile, so the
#                                       very Dockerfile users build with Docker builds here too
#   pko:dev                             the operator (top-level Dockerfile, buildah bud)
#   pko-agent:dev                       the agent (hack/build-agent-image.sh)
#   pko-workspace:dev                   the default workspace image: the real Pulumi CLI, language hosts
#                                       and providers (hack/build-pulumi.sh, from their Go modules; the
#                                       random and command providers and the Node.js and Go hosts from
#                                       pinned source, hack/build-sources.sh; Node.js, npm, the Node.js
#                                       SDK packages and Go, hack/build-runtimes.sh) on the base
#                                       (images/workspace/Dockerfile)
#   localhost/pko-seaweedfs:dev         SeaweedFS, the S3-compatible state store of config/samples/s3
#                                       (hack/build-seaweedfs.sh, from its Go module)
#
# Usage: hack/build-images.sh [SET...] [OUTPUT_DIR]   (default ~/.cache/pko/images)
#   SET  sample  the base, pko, pko-agent and pko-workspace: what config/local and config/samples run
#                (hack/up.sh builds only these, and its node imports only these)
#        s3      SeaweedFS: what config/samples/s3 adds (about 5 minutes cold, the only image it needs)
#        all     both (the default: hack/test.sh and e2e/, whose node imports every archive of the cache)
# Prints the chosen sets' archive paths, one a line, for `hack/localnode.py up --import` or
# `import-images --import`. A directory named like a set is given as ./NAME.
#
# Each image is rebuilt only when its inputs changed (a content hash stored beside the archive), so a
# second run with no change takes seconds. buildah uses vfs storage under ~/.cache/pko/buildah.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
# The sets, by archive name (the image's repository name; test/test_build_images.py checks them against
# what the samples' manifests name).
SAMPLE_IMAGES=(pko-base-python pko pko-agent pko-workspace)
S3_IMAGES=(pko-seaweedfs)
WANT=(); OUT=""
for arg in "$@"; do
    case "$arg" in
        sample) WANT+=("${SAMPLE_IMAGES[@]}") ;;
        s3) WANT+=("${S3_IMAGES[@]}") ;;
        all) WANT+=("${SAMPLE_IMAGES[@]}" "${S3_IMAGES[@]}") ;;
        *) [ -z "$OUT" ] || { echo "usage: hack/build-images.sh [sample|s3|all]... [OUTPUT_DIR]" >&2; exit 2; }
           OUT="$arg" ;;
    esac
done
[ ${#WANT[@]} -gt 0 ] || WANT=("${SAMPLE_IMAGES[@]}" "${S3_IMAGES[@]}")
OUT="${OUT:-$CACHE/images}"
wants() { [[ " ${WANT[*]} " == *" $1 "* ]]; }
STORE="$CACHE/buildah"
BASE_IMAGE="localhost/pko-base-python:bookworm"
mkdir -p "$OUT" "$STORE/tmp"

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
missing=()
for pkg in buildah mmdebstrap tini busybox-static; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build-images: installing ${missing[*]}" >&2
    exec 8>"${TMPDIR:-/tmp}/pko-apt.lock"; flock 8   # one apt at a time (pko/devtools/localcluster.py's lock)
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    exec 8>&-
fi

# RUN steps reach PyPI through whatever TLS setup this host has (a proxy with its own CA, say):
# lend them the host's CA bundle and a pip.conf that uses it. Nothing of it stays in an image.
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$STORE/pip.conf"
RUN_MOUNTS=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro -v "$STORE/pip.conf:/etc/pip.conf:ro")

bah() {
    TMPDIR="$STORE/tmp" buildah --storage-driver vfs --root "$STORE/root" --runroot "$STORE/run" "$@"
}

# A digest of the files (and extra strings) an image is built from.
inputs_hash() {
    local extra="$1"; shift
    { printf '%s\n' "$extra"; (cd "$REPO" && git ls-files -s -- "$@" 2>/dev/null || find "$@" -type f -exec sha256sum {} +);
      (cd "$REPO" && git diff --no-ext-diff HEAD -- "$@" 2>/dev/null || true); } | sha256sum | cut -c1-16
}

# up_to_date NAME HASH: the archive exists and was built from HASH.
up_to_date() {
    [ -f "$OUT/$1.oci.tar" ] && [ "$(cat "$OUT/$1.hash" 2>/dev/null)" = "$2" ]
}

export_archive() {  # IMAGE NAME HASH
    rm -f "$OUT/$2.oci.tar.partial"
    bah push --quiet "$1" "oci-archive:$OUT/$2.oci.tar.partial:$1" >&2
    mv -f "$OUT/$2.oci.tar.partial" "$OUT/$2.oci.tar"
    echo "$3" > "$OUT/$2.hash"
}

# --- the base: Debian bookworm with python3, from Debian packages ---------------------------------------
MIRROR="${PKO_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates"
base_hash="$(printf 'bookworm %s %s v1' "$MIRROR" "$BASE_PACKAGES" | sha256sum | cut -c1-16)"
if wants pko-base-python && { ! up_to_date pko-base-python "$base_hash" || ! bah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; }; then
    echo "build-images: building $BASE_IMAGE (mmdebstrap)" >&2
    work="$(mktemp -d "$STORE/tmp/base.XXXXXX")"
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
        --aptopt='Acquire::Retries "3"' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
        bookworm "$work/rootfs.tar" "$MIRROR" >&2
    ctr="$(bah from --quiet scratch)"
    bah add --quiet "$ctr" "$work/rootfs.tar" / >&2
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd '["python3"]' "$ctr" >&2
    bah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
    rm -rf "$work"
    export_archive "$BASE_IMAGE" pko-base-python "$base_hash"
fi

# --- the operator: the top-level Dockerfile, on that base --------------------------------------------
op_hash="$(inputs_hash "$base_hash" Dockerfile .dockerignore pyproject.toml requirements.lock README.md pko api agent \
    ':(exclude)pko/devtools')"  # the tests' and tools' support is not in the image (.dockerignore)
if wants pko && ! up_to_date pko "$op_hash"; then
    echo "build-images: building pko:dev (Dockerfile)" >&2
    bah bud --quiet --isolation chroot --layers=false --build-arg "PYTHON_IMAGE=$BASE_IMAGE" "${RUN_MOUNTS[@]}" \
        -f "$REPO/Dockerfile" -t localhost/pko:dev "$REPO" >&2
    bah tag localhost/pko:dev docker.io/library/pko:dev >&2
    export_archive docker.io/library/pko:dev pko "$op_hash"
fi

# --- the agent ----------------------------------------------------------------------------------------
# What the agent imports of pko beyond pko.agent and pko.api (pko/version.py: its --version and User-Agent;
# the metrics server's modules: its --metrics-bind-address).
agent_hash="$(inputs_hash "" agent api pko/__init__.py pko/logging.py pko/version.py pko/git \
    pko/machinery/serving.py pko/machinery/metricsauth.py pko/machinery/servingcert.py \
    pko/machinery/kubeconfigfile.py pyproject.toml requirements.lock requirements-build.lock hack/locks.py \
    hack/build-agent.sh hack/build-agent-image.sh)"
if wants pko-agent && ! up_to_date pko-agent "$agent_hash"; then
    echo "build-images: building pko-agent:dev" >&2
    PKO_AGENT_IMAGE=docker.io/library/pko-agent:dev bash "$REPO/hack/build-agent-image.sh" "$OUT" >&2
    echo "$agent_hash" > "$OUT/pko-agent.hash"
fi

# --- the workspace image: the real Pulumi engine ---------------------------------------------------------
# The engine is built on this host (Go modules, cached by version in ~/.cache/pko), and so are the
# providers and language hosts the proxy refuses (hack/build-sources.sh, from pinned source archives
# or clones, cached under a key of their own); both are handed to the Dockerfile as ENGINE_IMAGE, a
# scratch image holding them at /engine and /sources: no golang image can be pulled here.
if wants pko-workspace; then  # the engine's builds too (about 20 minutes cold)
    ENGINE_DIR="$(bash "$REPO/hack/build-pulumi.sh" | tail -n 1)"
    SOURCES_DIR="$(bash "$REPO/hack/build-sources.sh" | tail -n 1)"
    RUNTIMES_DIR="$(bash "$REPO/hack/build-runtimes.sh" | tail -n 1)"
    engine_key="$(basename "$(dirname "$ENGINE_DIR")")"
    sources_key="$(basename "$(dirname "$SOURCES_DIR")")"
    runtimes_key="$(basename "$(dirname "$RUNTIMES_DIR")")"
    ws_hash="$(inputs_hash "$base_hash $engine_key $sources_key $runtimes_key" images/workspace hack/versions.env \
        requirements-workspace.lock requirements-policy.lock hack/build-pulumi.sh hack/build-sources.sh \
        hack/build-runtimes.sh hack/gomod.sh)"
    engine_image="localhost/pko-pulumi-engine:$engine_key-${sources_key##*-}-${runtimes_key##*-}"
    workspace_bud() {  # TARGET-ARGS... : buildah bud of images/workspace/Dockerfile on the host-built engine
        if ! bah inspect --type image "$engine_image" >/dev/null 2>&1; then
            ctr="$(bah from --quiet scratch)"
            bah copy --quiet "$ctr" "$ENGINE_DIR" /engine >/dev/null
            bah copy --quiet "$ctr" "$SOURCES_DIR" /sources >/dev/null
            bah copy --quiet "$ctr" "$RUNTIMES_DIR" /runtimes >/dev/null
            bah commit --quiet --rm "$ctr" "$engine_image" >/dev/null
        fi
        bah bud --quiet --isolation chroot --layers=false --build-arg "PYTHON_IMAGE=$BASE_IMAGE" \
            --build-arg "ENGINE_IMAGE=$engine_image" "${RUN_MOUNTS[@]}" \
            --ignorefile "$REPO/images/workspace/Dockerfile.dockerignore" \
            -f "$REPO/images/workspace/Dockerfile" "$@" "$REPO" >&2
    }
    if ! up_to_date pko-workspace "$ws_hash"; then
        echo "build-images: building pko-workspace:dev (images/workspace/Dockerfile, engine $engine_key, $sources_key, $runtimes_key)" >&2
        workspace_bud -t docker.io/library/pko-workspace:dev
        export_archive docker.io/library/pko-workspace:dev pko-workspace "$ws_hash"
    fi
    # On request (PKO_WORKSPACE_CORE_OUT=DIR), the core image too: YAML and Python only (`--target core`), for
    # hack/bench/languages.py; in a directory of its own, so no node imports it unasked.
    if [ -n "${PKO_WORKSPACE_CORE_OUT:-}" ] && ! OUT="$PKO_WORKSPACE_CORE_OUT" up_to_date pko-workspace-core "$ws_hash"; then
        echo "build-images: building pko-workspace-core:dev (images/workspace/Dockerfile --target core)" >&2
        mkdir -p "$PKO_WORKSPACE_CORE_OUT"
        workspace_bud --target core -t docker.io/library/pko-workspace-core:dev
        OUT="$PKO_WORKSPACE_CORE_OUT" export_archive docker.io/library/pko-workspace-core:dev pko-workspace-core "$ws_hash"
    fi
fi
rm -f "$OUT/pko-workspace-standin.oci.tar" "$OUT/pko-workspace-standin.hash"  # the retired stand-in image

# --- SeaweedFS: the object store config/samples/s3 keeps Pulumi state in ----------------------------------
# Its own script, cache key and buildah storage (as hack/build-peer.sh); it puts the archive in $OUT, with
# the .hash beside it naming the build, and returns at once when that copy is current.
if wants pko-seaweedfs; then bash "$REPO/hack/build-seaweedfs.sh" "$OUT" >/dev/null; fi

# vfs storage keeps a whole copy of every image: drop what no build uses any more (the images a rebuild
# replaced, engine images of other pins), or the disk fills and a node on it evicts its own images.
if wants pko-workspace; then  # (no engine image is known otherwise: keep them all)
    for old in $(bah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep '^localhost/pko-pulumi-engine:' || true); do
        [ "$old" = "$engine_image" ] || bah rmi --force "$old" >/dev/null 2>&1 || true
    done
fi
bah rmi --prune >/dev/null 2>&1 || true

for name in "${SAMPLE_IMAGES[@]}" "${S3_IMAGES[@]}"; do
    if wants "$name"; then ls -1 "$OUT/$name.oci.tar"; fi
done
