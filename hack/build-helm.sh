#!/usr/bin/env bash
# Build the Helm CLI at the version pinned in hack/versions.env (HELM_VERSION), cached outside the repo.
# charts/pko is generated from config/ (hack/gen_helm.py); test/test_helm_chart.py,
# test_helm_operator_values.py and test_helm_install.py render, lint and install it with the real helm, so
# the chart users get is the one the tests ran. No release download is reachable here: helm is built from
# its Go module, as every other tool the project needs.
#
# How: upstream's own build of ./cmd/helm (helm.sh/helm/v3, go.mod and go.sum unchanged, every dependency
# from the Go module proxy through hack/gomod.sh's environment: CGO off, no toolchain switch), static and
# stripped (-trimpath -ldflags "-s -w"), with the stamps upstream's Makefile sets: the version
# (internal/version.version, else `helm version` says only the minor release) and the Kubernetes version
# its client-go is for (pkg/chartutil and pkg/lint/rules k8sVersionMajor/Minor: `.Capabilities.KubeVersion`
# in `helm template`, and what `helm lint` checks deprecated APIs against). Built in a writable copy of the
# module, as upstream builds it from its own tree. 132 s cold on 2 shared cores (empty module and build
# caches: its dependencies downloaded with it), 104 s with the module cache the other builds fill.
#
# Usage: hack/build-helm.sh   build (idempotent: a second run with the same pin prints the directory at
#                             once); logs each step's time on stderr and prints the output directory last:
#   ${PKO_CACHE_DIR:-~/.cache/pko}/helm-<version>-<digest of the pin>/dist, which holds
#     bin/helm   the Helm CLI
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-helm.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
# shellcheck source=hack/gotool.sh
. "$REPO/hack/gotool.sh"

[ $# -eq 0 ] || die "usage: hack/build-helm.sh"

# Helm's module path carries its major version (helm.sh/helm/v3 for 3.x).
gotool_begin helm helm "$HELM_VERSION" "helm.sh/helm/v${HELM_VERSION%%.*}" helm

# A -X for a variable that is not there is silently ignored: check each stamp's variable exists, and that
# the module's own version names the pin's minor release, so a wrong pin cannot pass for a right one.
version_go="$WORK/internal/version/version.go"
grep -q "^[[:space:]]*version = \"v${HELM_VERSION%.*}\"$" "$version_go" \
    || die "$MODULE@$VERSION: $version_go does not name v${HELM_VERSION%.*}: upstream's version stamp moved"
for file in pkg/chartutil/capabilities.go pkg/lint/rules/deprecations.go; do
    grep -q '^[[:space:]]*k8sVersionMajor = ' "$WORK/$file" && grep -q '^[[:space:]]*k8sVersionMinor = ' "$WORK/$file" \
        || die "$MODULE@$VERSION: $file has no k8sVersionMajor/k8sVersionMinor: upstream's Kubernetes stamp moved"
done

step "helm $VERSION (./cmd/helm)"
# Upstream's Makefile: client-go v0.X.Y is Kubernetes 1.X.
client_go="$(cd "$WORK" && go list -m -f '{{.Version}}' k8s.io/client-go)"
k8s_minor="$(cut -d. -f2 <<<"${client_go#v}")"
[[ "$client_go" == v0.* && "$k8s_minor" =~ ^[0-9]+$ ]] || die "unexpected k8s.io/client-go version $client_go"
stamps="-X $MODULE/internal/version.version=$VERSION"
for pkg in pkg/chartutil pkg/lint/rules; do
    stamps+=" -X $MODULE/$pkg.k8sVersionMajor=1 -X $MODULE/$pkg.k8sVersionMinor=$k8s_minor"
done
(cd "$WORK" && go build -trimpath -ldflags "-s -w $stamps" -o "$NEW/bin/helm" ./cmd/helm)
reported="$("$NEW/bin/helm" version --template '{{.Version}}')"
[ "$reported" = "$VERSION" ] || die "the built helm says it is $reported, not $VERSION"
log "helm $reported (Kubernetes 1.$k8s_minor, client-go $client_go)"
took

gotool_finish
