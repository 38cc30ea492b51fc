#!/usr/bin/env bash
# Build `kstatus`: a few lines of Go over sigs.k8s.io/cli-utils' kstatus (the library Flux's health checks
# and kpt judge resources with), written below into the cache at build time (the repository keeps build
# scripts, no Go module), its two direct modules pinned here and the rest resolved by `go mod tidy`, every
# module from the Go module proxy through hack/gomod.sh's environment; cached under a key of this script.
#
# Usage: hack/build-kstatus.sh   build (idempotent; prints the output directory last:
#   ${PKO_CACHE_DIR:-~/.cache/pko}/kstatus-<digest of this script>/dist, which holds bin/kstatus)
if [ -z "${BASH_VERSION:-}" ]; then echo "hack/build-kstatus.sh: needs bash" >&2; exit 2; fi
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/gotool.sh
. "$REPO/hack/gotool.sh"
[ $# -eq 0 ] || die "usage: hack/build-kstatus.sh"

CLI_UTILS_VERSION=v0.37.2      # sigs.k8s.io/cli-utils
APIMACHINERY_VERSION=v0.35.0   # k8s.io/apimachinery
cache_root="${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}"
OUT="$cache_root/kstatus-$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-10)"
if [ -x "$OUT/dist/bin/kstatus" ]; then echo "$OUT/dist"; exit 0; fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.build-kstatus.lock"
flock 9
if [ -x "$OUT/dist/bin/kstatus" ]; then echo "$OUT/dist"; exit 0; fi
# shellcheck source=hack/gomod.sh
. "$REPO/hack/gomod.sh"
gomod_env
step "kstatus (sigs.k8s.io/cli-utils $CLI_UTILS_VERSION)"
SRC="$OUT/src"
rm -rf "$OUT/dist.partial" "$SRC"
mkdir -p "$OUT/dist.partial/bin" "$SRC"
cat >"$SRC/go.mod" <<GOMOD
module pko.local/kstatus

go 1.26

require (
	k8s.io/apimachinery $APIMACHINERY_VERSION
	sigs.k8s.io/cli-utils $CLI_UTILS_VERSION
)
GOMOD
cat >"$SRC/main.go" <<'GOMAIN'
// kstatus prints what the kstatus library (sigs.k8s.io/cli-utils/pkg/kstatus/status) computes for each
// Kubernetes object it reads: Flux's health checks, `flux ... --wait`, kpt and cli-utils' appliers all
// judge a custom resource this way. The tests feed it Stacks exactly as the operator wrote them.
//
// Usage: kstatus < objects.json   (a JSON object, or a JSON list of objects, or a `kind: List`)
// Prints one JSON line per object: {"name": ..., "status": "Current|InProgress|Failed|...", "message": ...}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "k8s.io/apimachinery/pkg/util/json" // numbers as int64, as unstructured objects hold them
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	var objects []map[string]interface{}
	if err := kjson.Unmarshal(input, &objects); err != nil {
		var one map[string]interface{}
		if err := kjson.Unmarshal(input, &one); err != nil {
			fail(fmt.Errorf("stdin is neither a JSON object nor a list of them: %w", err))
		}
		if items, ok := one["items"].([]interface{}); ok && one["kind"] == "List" {
			for _, item := range items {
				if obj, ok := item.(map[string]interface{}); ok {
					objects = append(objects, obj)
				}
			}
		} else {
			objects = []map[string]interface{}{one}
		}
	}
	out := json.NewEncoder(os.Stdout)
	for _, obj := range objects {
		u := &unstructured.Unstructured{Object: obj}
		computed, err := status.Compute(u)
		if err != nil {
			fail(fmt.Errorf("%s: %w", u.GetName(), err))
		}
		if err := out.Encode(result{u.GetName(), computed.Status.String(), computed.Message}); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(1)
}
GOMAIN
(cd "$SRC" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$OUT/dist.partial/bin/kstatus" .)
took
rm -rf "$OUT/dist"
mv "$OUT/dist.partial" "$OUT/dist"
echo "$OUT/dist"
