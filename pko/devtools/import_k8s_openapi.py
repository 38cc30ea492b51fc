#!/usr/bin/env python3
"""Import the Kubernetes OpenAPI definitions our CRDs embed (PodTemplateSpec and friends).

Why: a CRD schema silently prunes every field it does not list, so an embedded pod template
must be described by a Kubernetes release at least as recent as the one it runs on: a field the
import lacks (e.g. 1.37's `emptyDir.mode`) is silently dropped from a Workspace's podTemplate.
The import is the release the tests run (`KUBERNETES_VERSION` in hack/versions.env), and a
cluster test cross-checks it against the test apiserver's own /openapi/v2.

Sources, each the upstream swagger with descriptions:

* `--from-go-module`: `api/openapi-spec/swagger.json` of the Go module
  `k8s.io/kubernetes@v<KUBERNETES_VERSION>`, fetched by `go mod download` into the cache
  hack/build-kubernetes.sh uses (`~/.cache/pko/go/mod`); the recorded `commit` is the module's
  go.sum hash (`h1:...`): the proxy gives no git commit, the hash pins the content just as well;
* `--from-mirror`: `kubernetes_asyncio/swagger.json.unprocessed` of a bare mirror of
  tomplus/kubernetes_asyncio (our client library; its release lags Kubernetes);
* `--swagger PATH --release X.Y.Z`: any swagger.json.

This script writes the *raw* transitive closure of the definitions reachable from `ROOTS`
(descriptions and vendor extensions kept, nothing rewritten) to
`api/schemas/k8s-openapi-v<release>.json`:

    {"source": {"repository", "commit", "path", "kubernetesRelease"}, "definitions": {...}}

Turning a definition into a CRD-compatible schema is `pko.api.k8sschema`'s job, at run time,
so the committed file stays a faithful, reviewable excerpt of upstream.

Invariants: exactly one `k8s-openapi-v*.json` exists in api/schemas (older ones are removed);
the output is byte-for-byte a function of (swagger, ROOTS, source) -- sorted keys, fixed
indentation -- so `--check` can re-derive it.

Usage:
    hack/import_k8s_openapi.py --from-go-module         # k8s.io/kubernetes@v$KUBERNETES_VERSION
    hack/import_k8s_openapi.py --from-mirror            # the local bare mirror of kubernetes_asyncio
    hack/import_k8s_openapi.py --swagger PATH --release 1.35.0 [--commit SHA]
    hack/import_k8s_openapi.py --check                  # committed file == closure of ROOTS over itself
    hack/import_k8s_openapi.py --check --from-mirror    # ... and == a fresh import from the mirror

Stdlib and `go` only, so it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pko.devtools.versions import VERSIONS_ENV, cache_dir, versions

HACK_DIR = Path(__file__).resolve().parents[2] / "hack"

REPO_ROOT = HACK_DIR.parent
SCHEMA_DIR = REPO_ROOT / "api" / "schemas"
FILE_PREFIX = "k8s-openapi-v"

SOURCE_REPOSITORY = "https://github.com/tomplus/kubernetes_asyncio"
SOURCE_PATH = "kubernetes_asyncio/swagger.json.unprocessed"
# kubernetes_asyncio records the Kubernetes release its client was generated from here;
# the swagger's own info.version is "unversioned".
RELEASE_CONSTANTS_PATH = "scripts/constants.py"
DEFAULT_MIRROR = Path("/work/.mirror/tomplus+kubernetes_asyncio/repo")

GO_MODULE = "k8s.io/kubernetes"
GO_MODULE_REPOSITORY = "https://github.com/kubernetes/kubernetes"
GO_MODULE_SWAGGER = "api/openapi-spec/swagger.json"
# Where hack/gomod.sh keeps Go modules (tests look there to know whether the module is already cached).
GOMODCACHE = cache_dir() / "go" / "mod"

_CORE = "io.k8s.api.core.v1."
_META = "io.k8s.apimachinery.pkg.apis.meta.v1."
ROOTS: tuple[str, ...] = (
    *(
        _CORE + name
        for name in (
            "PodTemplateSpec",
            "PodSpec",
            "ServiceSpec",
            "ResourceRequirements",
            "EnvVar",
            "EnvFromSource",
            "Volume",
            "VolumeMount",
            "LocalObjectReference",
            "SecretKeySelector",
            "ConfigMapKeySelector",
            "ObjectReference",
            "Affinity",
            "Toleration",
            "SecurityContext",
            "PodSecurityContext",
            "Container",
        )
    ),
    *(_META + name for name in ("ObjectMeta", "LabelSelector", "Condition")),
)

_REF_PREFIX = "#/definitions/"
_RELEASE_RE = re.compile(r"^v?(\d+\.\d+\.\d+)$")


class ImportError_(Exception):
    """The swagger cannot be imported as asked (missing definition, unknown release, ...)."""


def iter_refs(node: Any) -> Iterator[str]:
    """Yield the definition names of every `$ref` anywhere below `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                if not isinstance(value, str) or not value.startswith(_REF_PREFIX):
                    raise ImportError_(f"unsupported $ref {value!r}")
                yield value[len(_REF_PREFIX) :]
            else:
                yield from iter_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from iter_refs(item)


def closure(definitions: Mapping[str, Any], roots: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The definitions reachable from `roots` (default ROOTS) through `$ref`, unchanged, sorted by name."""
    seen: set[str] = set()
    pending = list(ROOTS if roots is None else roots)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        if name not in definitions:
            raise ImportError_(f"definition {name!r} is referenced but not in the swagger")
        seen.add(name)
        pending.extend(iter_refs(definitions[name]))
    return {name: definitions[name] for name in sorted(seen)}


def normalize_release(release: str) -> str:
    match = _RELEASE_RE.match(release.strip())
    if match is None:
        raise ImportError_(f"not a Kubernetes release (want e.g. v1.35.0): {release!r}")
    return match.group(1)


def build_document(
    swagger: Mapping[str, Any], *, release: str, repository: str, commit: str, path: str
) -> dict[str, Any]:
    return {
        "source": {
            "repository": repository,
            "commit": commit,
            "path": path,
            "kubernetesRelease": normalize_release(release),
        },
        "definitions": closure(swagger["definitions"]),
    }


def render(document: Mapping[str, Any]) -> str:
    """The canonical text of the committed file (deterministic: sorted keys, fixed indent)."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def output_path(release: str) -> Path:
    return SCHEMA_DIR / f"{FILE_PREFIX}{normalize_release(release)}.json"


def committed_files() -> list[Path]:
    return sorted(SCHEMA_DIR.glob(f"{FILE_PREFIX}*.json"))


def release_from_swagger(swagger: Mapping[str, Any]) -> str | None:
    """The release in info.version when the swagger states one (kubernetes_asyncio's does not)."""
    version = str(swagger.get("info", {}).get("version", ""))
    return version if _RELEASE_RE.match(version) else None


def _git(mirror: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(mirror), *args], check=True, capture_output=True, text=True)
    return result.stdout


def read_mirror(mirror: Path) -> tuple[dict[str, Any], str, str]:
    """(swagger, release, commit) from the bare mirror.

    The commit is the last one that changed the swagger, so that unrelated upstream commits do
    not churn the committed file; the release is read from scripts/constants.py at that commit.
    """
    commit = _git(mirror, "log", "-1", "--format=%H", "HEAD", "--", SOURCE_PATH).strip()
    if not commit:
        raise ImportError_(f"{SOURCE_PATH} not found in {mirror}")
    swagger = json.loads(_git(mirror, "show", f"{commit}:{SOURCE_PATH}"))
    release = release_from_swagger(swagger)
    if release is None:
        constants = _git(mirror, "show", f"{commit}:{RELEASE_CONSTANTS_PATH}")
        match = re.search(r'^KUBERNETES_BRANCH\s*=\s*"([^"]+)"', constants, re.MULTILINE)
        if match is None:
            raise ImportError_(f"no KUBERNETES_BRANCH in {RELEASE_CONSTANTS_PATH} at {commit}")
        release = match.group(1)
    return swagger, release, commit


def pinned_release() -> str:
    """KUBERNETES_VERSION from hack/versions.env: the release the tests and the node run."""
    release = versions().get("KUBERNETES_VERSION")
    if release is None:
        raise ImportError_(f"no KUBERNETES_VERSION in {VERSIONS_ENV}")
    return normalize_release(release)


def read_go_module(release: str) -> tuple[dict[str, Any], str]:
    """(swagger, go.sum hash) of k8s.io/kubernetes@v<release>, downloaded once (hack/gomod.sh)."""
    gomod = str(REPO_ROOT / "hack" / "gomod.sh")
    result = subprocess.run(
        ["bash", gomod, "download", GO_MODULE, f"v{normalize_release(release)}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ImportError_(result.stderr.strip())
    module = json.loads(result.stdout)
    swagger = json.loads((Path(module["Dir"]) / GO_MODULE_SWAGGER).read_text(encoding="utf-8"))
    return swagger, str(module["Sum"])


def write(document: Mapping[str, Any]) -> Path:
    """Write the document and remove every other imported release: exactly one is committed."""
    target = output_path(document["source"]["kubernetesRelease"])
    SCHEMA_DIR.mkdir(parents=True, exist_ok=True)
    target.write_text(render(document), encoding="utf-8")
    for other in committed_files():
        if other != target:
            other.unlink()
            print(f"removed {other.relative_to(REPO_ROOT)}", file=sys.stderr)
    return target


def load_committed() -> tuple[Path, dict[str, Any]]:
    files = committed_files()
    if len(files) != 1:
        raise ImportError_(f"expected exactly one {FILE_PREFIX}*.json in {SCHEMA_DIR}, found {files}")
    return files[0], json.loads(files[0].read_text(encoding="utf-8"))


def check(fresh: Mapping[str, Any] | None = None) -> list[str]:
    """Problems with the committed file; empty when it is what this script would write.

    Without `fresh`, the committed definitions are taken as the swagger: the closure of ROOTS
    over them must be all of them (no stale extras, no missing root), and re-rendering must give
    the committed bytes. With `fresh` (a new import), the committed file must equal it exactly.
    """
    path, committed = load_committed()
    problems: list[str] = []
    source = committed.get("source", {})
    try:
        expected = fresh or build_document(
            committed,
            release=str(source.get("kubernetesRelease", "")),
            repository=str(source.get("repository", "")),
            commit=str(source.get("commit", "")),
            path=str(source.get("path", "")),
        )
    except ImportError_ as exc:
        return [f"{path.name}: {exc}"]
    if path != output_path(expected["source"]["kubernetesRelease"]):
        problems.append(f"{path.name} is not named after release {expected['source']['kubernetesRelease']}")
    if set(source) != {"repository", "commit", "path", "kubernetesRelease"}:
        problems.append(f"source record has keys {sorted(source)}")
    extra = sorted(set(committed["definitions"]) - set(expected["definitions"]))
    missing = sorted(set(expected["definitions"]) - set(committed["definitions"]))
    if extra:
        problems.append(f"definitions not reachable from ROOTS: {extra}")
    if missing:
        problems.append(f"definitions missing: {missing}")
    changed = sorted(
        name
        for name in set(expected["definitions"]) & set(committed["definitions"])
        if expected["definitions"][name] != committed["definitions"][name]
    )
    if changed:
        problems.append(f"definitions differ from the source: {changed}")
    if fresh is not None and expected["source"] != source:
        problems.append(f"source record {source} != {expected['source']}")
    if not problems and path.read_text(encoding="utf-8") != render(expected):
        problems.append(f"{path.name} is not in canonical form (re-run this script)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    origin = parser.add_mutually_exclusive_group()
    origin.add_argument("--swagger", type=Path, help="a swagger.json (with descriptions)")
    origin.add_argument(
        "--from-go-module",
        action="store_true",
        help=f"the Go module {GO_MODULE} at --release (default: KUBERNETES_VERSION of hack/versions.env), "
        "downloaded once through the Go module proxy by hack/gomod.sh",
    )
    origin.add_argument(
        "--from-mirror",
        nargs="?",
        const=DEFAULT_MIRROR,
        type=Path,
        metavar="GIT_DIR",
        help=f"bare git mirror of tomplus/kubernetes_asyncio (default {DEFAULT_MIRROR})",
    )
    parser.add_argument("--release", help="Kubernetes release of --swagger (when info.version has none)")
    parser.add_argument("--commit", default="", help="source commit of --swagger, recorded as is")
    parser.add_argument("--repository", default=SOURCE_REPOSITORY, help="recorded source repository")
    parser.add_argument("--check", action="store_true", help="verify the committed file, write nothing")
    args = parser.parse_args(argv)

    try:
        fresh: dict[str, Any] | None = None
        if args.from_go_module:
            release = args.release or pinned_release()
            swagger, digest = read_go_module(release)
            fresh = build_document(
                swagger,
                release=release,
                repository=GO_MODULE_REPOSITORY,
                commit=digest,
                path=GO_MODULE_SWAGGER,
            )
        elif args.from_mirror is not None:
            swagger, release, commit = read_mirror(args.from_mirror)
            fresh = build_document(
                swagger, release=release, repository=SOURCE_REPOSITORY, commit=commit, path=SOURCE_PATH
            )
        elif args.swagger is not None:
            swagger = json.loads(args.swagger.read_text(encoding="utf-8"))
            stated = args.release or release_from_swagger(swagger)
            if not stated:
                raise ImportError_("the swagger states no release: pass --release")
            fresh = build_document(
                swagger, release=stated, repository=args.repository, commit=args.commit, path=SOURCE_PATH
            )

        if args.check:
            problems = check(fresh)
            for problem in problems:
                print(f"drift: {problem}", file=sys.stderr)
            return 1 if problems else 0
        if fresh is None:
            parser.error("give --from-go-module, --from-mirror, --swagger or --check")
        target = write(fresh)
    except (ImportError_, subprocess.CalledProcessError, OSError, ValueError) as exc:
        print(f"import_k8s_openapi: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {target.relative_to(REPO_ROOT)}: {len(fresh['definitions'])} definitions "
        f"from Kubernetes {fresh['source']['kubernetesRelease']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
