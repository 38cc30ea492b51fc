#!/usr/bin/env bash
# Build a current Kubernetes release's server binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy), kubectl, and etcd + etcdctl from the Go module proxy, cached
# outside the repo. Versions: hack/versions.env only (KUBERNETES_VERSION, ETCD_VERSION).
#
# Why this Kubernetes: the newest release the proxy serves whose kubelet still runs on the node's
# Debian bookworm containerd 1.6 (no CRI RuntimeConfig): cmd/kubelet/app/server.go's
# getCgroupDriverFromCRI still falls back to the kubelet config's cgroupDriver when the runtime answers
# Unimplemented (its CRILosingSupport metric names 1.38.0 as the release that drops this). The node is
# cgroup v1: since 1.35 the kubelet refuses it unless its config says `failCgroupV1: false`.
#
# How (each step verified against what the Go module proxy serves here):
#  - Kubernetes is built inside a writable copy of the k8s.io/kubernetes module, with its own go.mod,
#    go.sum and godebug line, so the binaries use the dependency versions upstream released with. Its
#    go.mod replaces every staging module (k8s.io/api, client-go, kubelet, ...) with ./staging/src/...,
#    which the module zip does not hold: each is replaced with its published v0.<minor>.<patch> instead
#    (the same source, published from staging/ at the release), and the replaces of staging modules it
#    does not require (sample-cli-plugin, sample-controller: not served) are dropped.
#  - upstream's release flags (hack/lib/golang.sh): CGO_ENABLED=0 for every binary, -trimpath,
#    -s -w, tags selinux,notest,grpcnotrace, and the version stamped with -X into component-base and
#    client-go (hack/lib/version.sh), so `--version` prints it. The commit is not known (the proxy gives
#    none), so gitCommit stays empty.
#  - etcd and etcdctl: each is built in a writable copy of its module (go.etcd.io/etcd/server/v3, whose
#    root package is the etcd main, and go.etcd.io/etcd/etcdctl/v3); their go.mod replaces the sibling
#    modules with ../api etc.: the replaces are dropped, so the published modules of the same version
#    they require are used.
#  - Go: both go.mod files say `go 1.26.0`; the local Go 1.26 builds them (GOTOOLCHAIN=local: etcd's
#    `toolchain go1.26.10` line is only a preference).
#
# Cold build here (two cores, niced beside other work): 7.5 minutes with the module downloads, 6 minutes
# from downloaded modules and an empty build cache (which grows by about 4 GB); kube-* take all but 25 s.
#
# Usage: hack/build-kubernetes.sh   prints the bin directory (last line), idempotent (a second run with
#                                   the same versions takes no time).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
OUT="$CACHE_ROOT/kubernetes-${KUBERNETES_VERSION}-etcd-${ETCD_VERSION}"
BIN_DIR="$OUT/bin"
KUBE_CMDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
BINARIES="$KUBE_CMDS etcd etcdctl"

have_all() { for b in $BINARIES; do [ -x "$BIN_DIR/$b" ] || return 1; done; }
if have_all; then echo "$BIN_DIR"; exit 0; fi

log() { echo "build-kubernetes: $(date +%T) $*" >&2; }
# One build at a time; the winner's result is reused by the others.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-kubernetes.lock"
flock 9
if have_all; then echo "$BIN_DIR"; exit 0; fi

# The Go environment and module copies of every hack/ build (caches under the pko cache).
# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env

WORK="$OUT/src"
NEW="$OUT/bin.partial"
rm -rf "$WORK" "$NEW"
mkdir -p "$WORK" "$NEW"

gobuild() {  # DIR OUTPUT TAGS LDFLAGS PACKAGE...
    local dir="$1" out="$2" tags="$3" ldflags="$4"
    shift 4
    (cd "$dir" && nice -n 19 go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$out" "$@")
}

log "k8s.io/kubernetes v$KUBERNETES_VERSION: preparing the module"
K8S="$WORK/kubernetes"
gomod_copy k8s.io/kubernetes "v$KUBERNETES_VERSION" "$K8S"
rm -rf "$K8S/vendor" "$K8S/go.work" "$K8S/go.work.sum"
STAGING_VERSION="v0.${KUBERNETES_VERSION#*.}"
edits=()
for m in $(sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*|\1|p' "$K8S/go.mod"); do
    if grep -q "^[[:space:]]*$m v0\.0\.0\b" "$K8S/go.mod"; then
        edits+=("-replace=$m=$m@$STAGING_VERSION")
    else
        edits+=("-dropreplace=$m")
    fi
done
(cd "$K8S" && go mod edit "${edits[@]}")
grep -q '=> \./staging' "$K8S/go.mod" && { echo "build-kubernetes: a staging replace is left" >&2; exit 1; }

MAJOR="${KUBERNETES_VERSION%%.*}"
MINOR="${KUBERNETES_VERSION#*.}"; MINOR="${MINOR%%.*}"
K8S_LDFLAGS=""
for kv in "gitVersion=v$KUBERNETES_VERSION" "gitMajor=$MAJOR" "gitMinor=$MINOR" "gitTreeState=clean" \
          "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    K8S_LDFLAGS="$K8S_LDFLAGS -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done
pkgs=()
for c in $KUBE_CMDS; do pkgs+=("./cmd/$c"); done
log "building $KUBE_CMDS (the longest step)"
gobuild "$K8S" "$NEW/" selinux,notest,grpcnotrace "$K8S_LDFLAGS" "${pkgs[@]}"

for mod in server etcdctl; do
    log "go.etcd.io/etcd/$mod/v3 v$ETCD_VERSION"
    gomod_copy "go.etcd.io/etcd/$mod/v3" "v$ETCD_VERSION" "$WORK/etcd-$mod"
    drops=()
    for m in $(sed -n 's|^[[:space:]]*\(go\.etcd\.io/etcd/[^[:space:]]*\) => \.\./.*|\1|p' "$WORK/etcd-$mod/go.mod"); do
        drops+=("-dropreplace=$m")
    done
    (cd "$WORK/etcd-$mod" && go mod edit "${drops[@]}")
    out=etcdctl; [ "$mod" = server ] && out=etcd
    gobuild "$WORK/etcd-$mod" "$NEW/$out" "" "" .
done

rm -rf "$BIN_DIR" "$WORK"
mv "$NEW" "$BIN_DIR"
"$BIN_DIR/kube-apiserver" --version >&2
"$BIN_DIR/etcd" --version >&2
log "done"
echo "$BIN_DIR"
