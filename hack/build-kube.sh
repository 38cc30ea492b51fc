#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy 1.20.2
# from Debian's `kubernetes` source package, cached outside the repo.
#
# Why from source: no registry reachable here ships Kubernetes server binaries; Debian ships
# the source. The vendored reflect2 v1.0.1 is replaced with v1.0.2, without which
# kube-apiserver built with Go 1.19 segfaults on the first labelled custom resource.
# The cache key includes that fix so an unfixed cache is never reused.
#
# Prints the bin directory on stdout (last line). Idempotent.
set -euo pipefail

KUBE_VERSION=1.20.2
CACHE_KEY="kube-${KUBE_VERSION}-reflect2-1.0.2-nullcheck-v2"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
BIN_DIR="$CACHE_ROOT/$CACHE_KEY/bin"
WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kube-proxy"
BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy"

have_all() {
  for b in $BINARIES; do [ -x "$BIN_DIR/$b" ] || return 1; done
}

if have_all; then
  echo "$BIN_DIR"
  exit 0
fi

log() { echo "build-kube: $*" >&2; }

# One build at a time (parallel test runs may all ask for the binaries); the winner's result is
# reused by the others.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if have_all; then
  echo "$BIN_DIR"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

apt_updated=0
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated -eq 0 ]; then $SUDO apt-get update -qq >&2; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
}

# deb-src for the source package: same URIs as the existing deb entries.
if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  log "adding deb-src entries"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    sed 's/^Types: deb$/Types: deb-src/' "$f" | $SUDO tee "${f%.sources}-src.sources" >/dev/null
  done
  if [ -f /etc/apt/sources.list ]; then
    grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' | $SUDO tee /etc/apt/sources.list.d/pko-src.list >/dev/null || true
  fi
  apt_updated=0
fi

apt_install golang-go rsync jq make gcc golang-github-modern-go-reflect2-dev dpkg-dev

WORK="$CACHE_ROOT/build-$KUBE_VERSION"
mkdir -p "$WORK"
cd "$WORK"
if ! ls kubernetes_*orig.tar.gz >/dev/null 2>&1; then
  log "downloading Debian source package"
  [ $apt_updated -eq 1 ] || { $SUDO apt-get update -qq >&2; apt_updated=1; }
  apt-get source --download-only kubernetes >&2
fi
ORIG=$(ls kubernetes_*orig.tar.gz | head -1)
SRC="$WORK/src"
if [ ! -f "$SRC/.unpacked" ]; then
  rm -rf "$SRC"; mkdir -p "$SRC"
  log "unpacking $ORIG"
  tar -xzf "$ORIG" -C "$SRC" --strip-components=1
  touch "$SRC/.unpacked"
fi
cd "$SRC"

# The mandatory reflect2 fix (see header).
R2=/usr/share/gocode/src/github.com/modern-go/reflect2
rm -rf vendor/github.com/modern-go/reflect2
cp -r "$R2" vendor/github.com/modern-go/reflect2

for f in vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go vendor/github.com/go-openapi/validate/type.go; do
  sed -i 's/if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {/if data == nil {/' "$f"
  grep -q 'reflect.DeepEqual(reflect.Zero' "$f" && { log "null-check patch did not apply to $f"; exit 1; }
done

export GOPATH="$SRC/.go" CGO_ENABLED=0 GOFLAGS=-mod=vendor GO111MODULE=on
export GOCACHE="$CACHE_ROOT/gocache"
mkdir -p .go/src/k8s.io
[ -e .go/src/k8s.io/kubernetes ] || ln -s ../../.. .go/src/k8s.io/kubernetes
log "building $WHAT (several minutes)"
unset GOFLAGS
make WHAT="$WHAT" >&2

mkdir -p "$BIN_DIR.tmp"
for b in $BINARIES; do
  src=$(ls _output/bin/$b _output/local/bin/linux/*/$b 2>/dev/null | head -1)
  cp "$src" "$BIN_DIR.tmp/$b"
done
rm -rf "$BIN_DIR"; mkdir -p "$(dirname "$BIN_DIR")"
mv "$BIN_DIR.tmp" "$BIN_DIR"
# The unpacked tree is large; the tarball and go cache stay for rebuilds.
rm -rf "$SRC"
echo "$BIN_DIR"
