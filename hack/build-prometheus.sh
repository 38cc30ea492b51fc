#!/usr/bin/env bash
# Build Prometheus (`prometheus`) and `promtool` at the version pinned in hack/versions.env, cached outside
# the repo. promtool checks and unit-tests the alert rules in config/prometheus; the tests run a real
# Prometheus that scrapes the operator and evaluates those rules.
#
# How: upstream's own ./cmd/prometheus and ./cmd/promtool from github.com/prometheus/prometheus on the Go
# module proxy (3.x is published there as v0.3xx.y; go.mod and go.sum unchanged, through hack/gomod.sh's
# environment: CGO off, no toolchain switch), static and stripped, with the version stamps upstream's
# Makefile sets (github.com/prometheus/common/version). Built without the `builtinassets` tag: the web UI's
# compiled assets are not in the module, and nothing here uses the UI (the API and /metrics are built in).
# With upstream's `remove_all_sd` tag (plugins/*.go): only the file and HTTP service discovery and static
# targets, which is all a test or a scrape of a known address needs; it leaves out the cloud SDKs, which
# were most of the build's time.
#
# Usage: hack/build-prometheus.sh   build (idempotent: a second run with the same pin prints the directory
#                                   at once); logs each step's time on stderr and prints the directory last:
#   ${PKO_CACHE_DIR:-~/.cache/pko}/prometheus-<version>-<digest of the pin>/dist, which holds
#     bin/prometheus, bin/promtool
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-prometheus.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
. "$REPO/hack/versions.env"
# shellcheck source=hack/gotool.sh
. "$REPO/hack/gotool.sh"

[ $# -eq 0 ] || die "usage: hack/build-prometheus.sh"

gotool_begin prometheus prometheus "$PROMETHEUS_MODULE_VERSION" github.com/prometheus/prometheus prometheus promtool

# The module's VERSION file names the release the proxy's v0.3xx.y stands for: check the two pins agree.
[ "$(tr -d '[:space:]' <"$WORK/VERSION")" = "$PROMETHEUS_VERSION" ] \
    || die "$MODULE@$VERSION: its VERSION file says $(cat "$WORK/VERSION"), not $PROMETHEUS_VERSION"

step "prometheus and promtool $PROMETHEUS_VERSION"
common=github.com/prometheus/common/version
stamps="-X $common.Version=$PROMETHEUS_VERSION -X $common.Revision=$VERSION -X $common.Branch=module-proxy"
stamps+=" -X $common.BuildUser=pko -X $common.BuildDate=19700101-00:00:00"
for binary in prometheus promtool; do
    (cd "$WORK" && go build -trimpath -ldflags "-s -w $stamps" -tags remove_all_sd -o "$NEW/bin/$binary" "./cmd/$binary")
done
reported="$("$NEW/bin/promtool" --version 2>&1 | head -1)"
[[ "$reported" == *"version $PROMETHEUS_VERSION "* ]] || die "the built promtool says '$reported', not $PROMETHEUS_VERSION"
log "$reported"
took

gotool_finish
