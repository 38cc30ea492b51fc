#!/usr/bin/env bash
# Build the real Pulumi engine from its Go modules, offline from any release download, cached outside
# the repo: the CLI (`pulumi`), the YAML and Python language hosts, the Kubernetes provider
# (`pulumi-resource-kubernetes`) and the Python dynamic-provider shim. Versions: hack/versions.env only.
#
# How (each step verified against what the Go module proxy serves here):
#  - every module is built inside a writable copy of itself, with its own go.mod and go.sum, so the
#    binaries use exactly the dependency versions upstream released with. The CLI's pkg/go.mod says
#    `replace sdk/v3 => ../sdk`: the sdk module of the same version is copied beside it.
#  - upstream's release flags: CGO_ENABLED=0, -trimpath, tags osusergo,grpcnotrace, and the version
#    stamped with -X, so `pulumi version` prints it and the Automation API's version check passes.
#  - pulumi-kubernetes embeds a schema that is git-ignored (absent from the module zip): it is generated
#    in the copy with the provider's own generator first, as its Makefile does.
#  - the Python language host moved into an untagged nested module at v3.79 that the proxy does not
#    serve: it is built from the last sdk/v3 release that holds it (PULUMI_PYTHON_HOST_VERSION).
#  - not built here, because the proxy does not serve them: the Node.js and Go language hosts (untagged
#    nested modules), pulumi-command (provider module: 403 at its release and commit) and pulumi-random
#    (provider/v4: no version listed). hack/build-sources.sh builds them from pinned upstream source,
#    under a cache key of its own.
#
# Usage: hack/build-pulumi.sh   prints the engine directory (last line), idempotent (a second run with the
#                               same versions takes no time). The directory holds:
#     bin/       pulumi, the language hosts and the Python shims: put it first on PATH
#     plugins/   a $PULUMI_HOME/plugins tree with each provider installed at its exact version, the way
#                `pulumi plugin install resource NAME VERSION --file BINARY` lays it out
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
CACHE_ROOT="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
KEY="pulumi-${PULUMI_VERSION}-yaml-${PULUMI_YAML_VERSION}-python-${PULUMI_PYTHON_HOST_VERSION}-k8s-${PULUMI_KUBERNETES_VERSION}-v2"
OUT="$CACHE_ROOT/$KEY"
ENGINE="$OUT/engine"
BINARIES="bin/pulumi bin/pulumi-language-yaml bin/pulumi-language-python bin/pulumi-language-python-exec
bin/pulumi-resource-pulumi-python
plugins/resource-kubernetes-v${PULUMI_KUBERNETES_VERSION}/pulumi-resource-kubernetes"

have_all() { for b in $BINARIES; do [ -x "$ENGINE/$b" ] || return 1; done; }
if have_all; then echo "$ENGINE"; exit 0; fi

log() { echo "build-pulumi: $(date +%T) $*" >&2; }
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-pulumi.lock"
flock 9
if have_all; then echo "$ENGINE"; exit 0; fi

# The Go environment and module copies of every hack/ build (caches under the pko cache).
# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env

WORK="$OUT/src"
NEW="$OUT/engine.partial"
BIN="$NEW/bin"
rm -rf "$WORK" "$NEW"
mkdir -p "$WORK" "$BIN"

gobuild() {  # DIR OUTPUT PACKAGE LDFLAGS
    (cd "$1" && go build -trimpath -tags osusergo,grpcnotrace -ldflags "-s -w $4" -o "$2" "$3")
}

log "pulumi CLI v$PULUMI_VERSION"
gomod_copy github.com/pulumi/pulumi/sdk/v3 "v$PULUMI_VERSION" "$WORK/pulumi/sdk"
gomod_copy github.com/pulumi/pulumi/pkg/v3 "v$PULUMI_VERSION" "$WORK/pulumi/pkg"
gobuild "$WORK/pulumi/pkg" "$BIN/pulumi" ./cmd/pulumi \
    "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$PULUMI_VERSION"
# The Python dynamic-provider shim is a script in the sdk module (python/dist), and so is the script
# the Python language host runs a program with (python/cmd).
install -m 0755 "$WORK/pulumi/sdk/python/dist/pulumi-resource-pulumi-python" "$BIN/pulumi-resource-pulumi-python"
install -m 0755 "$WORK/pulumi/sdk/python/cmd/pulumi-language-python-exec" "$BIN/pulumi-language-python-exec"

log "pulumi-language-python (sdk v$PULUMI_PYTHON_HOST_VERSION)"
gomod_copy github.com/pulumi/pulumi/sdk/v3 "v$PULUMI_PYTHON_HOST_VERSION" "$WORK/pulumi-python-host"
gobuild "$WORK/pulumi-python-host" "$BIN/pulumi-language-python" ./python/cmd/pulumi-language-python \
    "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$PULUMI_PYTHON_HOST_VERSION"

log "pulumi-language-yaml v$PULUMI_YAML_VERSION"
gomod_copy github.com/pulumi/pulumi-yaml "v$PULUMI_YAML_VERSION" "$WORK/pulumi-yaml"
gobuild "$WORK/pulumi-yaml" "$BIN/pulumi-language-yaml" ./cmd/pulumi-language-yaml \
    "-X github.com/pulumi/pulumi-yaml/pkg/version.Version=v$PULUMI_YAML_VERSION"

log "pulumi-resource-kubernetes v$PULUMI_KUBERNETES_VERSION"
# provider/go.mod says `replace sdk/v4 => ../sdk` (the yaml/v2 and helm/v4 components import it): the sdk
# module of the same release is copied beside it, as in upstream's repository.
gomod_copy github.com/pulumi/pulumi-kubernetes/provider/v4 "$PULUMI_KUBERNETES_MODULE_VERSION" "$WORK/pulumi-kubernetes/provider"
gomod_copy github.com/pulumi/pulumi-kubernetes/sdk/v4 "v$PULUMI_KUBERNETES_VERSION" "$WORK/pulumi-kubernetes/sdk"
K8S="$WORK/pulumi-kubernetes/provider"
K8S_LDFLAGS="-X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$PULUMI_KUBERNETES_VERSION"
(cd "$K8S/cmd/pulumi-resource-kubernetes" && VERSION="$PULUMI_KUBERNETES_VERSION" go generate ./...)
gobuild "$K8S" "$WORK/pulumi-resource-kubernetes" ./cmd/pulumi-resource-kubernetes "$K8S_LDFLAGS"

# Install each provider as the CLI itself does, into a plugins tree of the engine's own.
PULUMI_HOME="$NEW/home" PULUMI_SKIP_UPDATE_CHECK=true "$BIN/pulumi" plugin install resource kubernetes \
    "$PULUMI_KUBERNETES_VERSION" --file "$WORK/pulumi-resource-kubernetes" >&2
mv "$NEW/home/plugins" "$NEW/plugins"
rm -rf "$NEW/home"

rm -rf "$ENGINE" "$WORK"
mv "$NEW" "$ENGINE"
"$ENGINE/bin/pulumi" version >&2
log "done"
echo "$ENGINE"
