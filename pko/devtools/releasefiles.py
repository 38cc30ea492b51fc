"""The files of a release (``dist/VERSION/``), as pure functions of what config/ and charts/ hold and of the
digests the push returned: hack/release.py does the I/O around them, and test/test_release_files.py
checks each against the objects it is made from.

- ``install.yaml``: every object of ``kubectl kustomize config/default`` (CRDs, RBAC, admission policy,
  the Deployment), each labelled with the version, and every image pinned ``REGISTRY/NAME:VERSION@sha256:``:
  the manager's, the agent image the workspaces bootstrap from (``AGENT_IMAGE``) and the default workspace
  image (``WORKSPACE_IMAGE``).
- ``quickstart.yaml``: what config/quickstart adds to it (the ``default/pulumi`` workspace ServiceAccount
  bound to ``system:auth-delegator``, the workspace NetworkPolicy), for a first Stack.
- the chart's ``values.yaml`` with the same pins as its defaults (its comments kept);
- the krew manifest of the ``kubectl-pko`` download, and ``SHA256SUMS``.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pko.kubectl.versions import VERSION_LABEL  # what `kubectl pko version` reads back

__all__ = [
    "IMAGES",
    "Pins",
    "install_objects",
    "krew_manifest",
    "oci_labels",
    "pin_values",
    "quickstart_objects",
    "sha256_of",
    "sha256sums",
    "to_yaml",
    "validate_version",
]

Obj = dict[str, Any]

# The images a release pushes: name in the registry -> the archive hack/build-images.sh writes.
IMAGES: Mapping[str, str] = {"pko": "pko", "pko-agent": "pko-agent", "pko-workspace": "pko-workspace"}
# SemVer 2.0.0, and 0.N.M while the API is not declared stable (a pre-release part is allowed: 0.2.0-rc.1).
_SEMVER = re.compile(r"0\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?")


def validate_version(text: str, code_version: str) -> str:
    """The release's version (``v0.N.M`` or ``0.N.M``) without its ``v``; it must be the code's."""
    version = text.removeprefix("v")
    if not _SEMVER.fullmatch(version):
        raise ValueError(
            f"{text!r} is not a version of pko: SemVer 0.N.M (e.g. v0.2.0) until the API is stable"
        )
    if version != code_version:
        raise ValueError(
            f"the tree is version {code_version} (pko/version.py), not {version}: "
            "bump VERSION there and add the CHANGELOG.md entry, commit, then release"
        )
    return version


@dataclass(frozen=True)
class Pins:
    """The pinned references (``HOST/PATH/NAME:VERSION@sha256:...``) of the three images."""

    operator: str
    agent: str
    workspace: str

    @classmethod
    def from_pushed(cls, pinned: Mapping[str, str]) -> Pins:
        return cls(pinned["pko"], pinned["pko-agent"], pinned["pko-workspace"])


def oci_labels(version: str, revision: str, source: str) -> dict[str, str]:
    """The OCI annotations every released image carries (image-spec's ``annotations.md`` keys)."""
    return {
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.licenses": "Apache-2.0",
    }


def _set_env(container: Obj, name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for item in env:
        if item.get("name") == name:
            item.pop("valueFrom", None)
            item["value"] = value
            return
    env.append({"name": name, "value": value})


def _label(obj: Obj, version: str) -> None:
    obj.setdefault("metadata", {}).setdefault("labels", {})[VERSION_LABEL] = version


def install_objects(rendered: Sequence[Obj], pins: Pins, version: str) -> list[Obj]:
    """``rendered`` (config/default) with every object labelled ``version`` and the images pinned."""
    objs = copy.deepcopy(list(rendered))
    deployments = [o for o in objs if o.get("kind") == "Deployment"]
    if len(deployments) != 1:
        raise ValueError(f"config/default renders {len(deployments)} Deployments; the release expects one")
    containers = deployments[0]["spec"]["template"]["spec"]["containers"]
    managers = [c for c in containers if c.get("name") == "manager"]
    if len(managers) != 1:
        raise ValueError("the Deployment has no `manager` container")
    manager = managers[0]
    manager["image"] = pins.operator
    manager["imagePullPolicy"] = "IfNotPresent"
    _set_env(manager, "AGENT_IMAGE", pins.agent)
    _set_env(manager, "AGENT_IMAGE_PULL_POLICY", "IfNotPresent")
    _set_env(manager, "WORKSPACE_IMAGE", pins.workspace)
    for obj in objs:
        _label(obj, version)
    _label(deployments[0]["spec"]["template"], version)
    return objs


def _key(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def quickstart_objects(quickstart: Sequence[Obj], default: Sequence[Obj], version: str) -> list[Obj]:
    """The objects config/quickstart renders that config/default does not, labelled ``version``."""
    base = {_key(o) for o in default}
    objs = [copy.deepcopy(o) for o in quickstart if _key(o) not in base]
    for obj in objs:
        _label(obj, version)
    return objs


def to_yaml(objs: Iterable[Obj], header: str) -> str:
    """A multi-document YAML file, in kubectl's order, with ``header`` as its leading comment."""
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + "---\n".join(yaml.safe_dump(o, sort_keys=False, width=1000) for o in objs)


def _split(pinned: str) -> dict[str, str]:
    """``HOST/PATH/NAME:TAG@DIGEST`` as the chart's image values."""
    name, _, digest = pinned.partition("@")
    ref, _, tag = name.rpartition(":")
    registry, _, repository = ref.partition("/")
    return {"registry": registry, "repository": repository, "tag": tag, "digest": digest}


# values.yaml's path to each image block.
_VALUE_PATHS = {"operator": ("image",), "agent": ("agent", "image"), "workspace": ("workspace", "image")}


def pin_values(text: str, pins: Pins) -> str:
    """The chart's values.yaml with the pins as the image defaults, its comments (the documentation helm
    shows) kept: each scalar is replaced on its own line, then the result is parsed to check it says
    exactly the pins and nothing else changed."""
    lines = text.splitlines(keepends=True)
    wanted: dict[tuple[str, ...], str] = {}
    for field, path in _VALUE_PATHS.items():
        for key, value in _split(getattr(pins, field)).items():
            wanted[(*path, key)] = value
    stack: list[tuple[int, str]] = []
    done: set[tuple[str, ...]] = set()
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z0-9_.-]+):( *)(.*?)(\r?\n)?$", line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(k for _, k in stack), m.group(2))
        if path in wanted:
            lines[i] = f"{m.group(1)}{m.group(2)}: {_quote(wanted[path])}{m.group(5) or ''}"
            done.add(path)
        elif not m.group(4):
            stack.append((indent, m.group(2)))
    missing = set(wanted) - done
    if missing:
        raise ValueError(f"values.yaml has no {sorted('.'.join(p) for p in missing)}: cannot pin the chart")
    result = "".join(lines)
    before, after = yaml.safe_load(text), yaml.safe_load(result)
    for path, value in wanted.items():
        node = before
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    if before != after:
        raise ValueError("pinning values.yaml changed more than the image values")
    return result


def _quote(value: str) -> str:
    return "''" if not value else yaml.safe_dump(value, default_style=None).strip().removesuffix("\n...")


def krew_manifest(version: str, uri: str, sha256: str, homepage: str) -> str:
    """krew's plugin manifest (``plugins/pko.yaml``, krew.sigs.k8s.io/v1alpha2) for the plugin's archive."""
    manifest = {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": "pko"},
        "spec": {
            "version": f"v{version}",
            "homepage": homepage,
            "shortDescription": "Stacks of the Pulumi Kubernetes Operator (pko): status, why, logs, approve",
            "description": (
                "kubectl pko shows and acts on pulumi.com/v1 Stacks: status, why one is not Ready, the\n"
                "engine's log of its last update, approval of a waiting plan, refresh and retry.\n"
                "It needs python3 (3.11 or newer) on PATH and nothing else.\n"
            ),
            "platforms": [
                {
                    "selector": {
                        "matchExpressions": [{"key": "os", "operator": "In", "values": ["linux", "darwin"]}]
                    },
                    "uri": uri,
                    "sha256": sha256,
                    "files": [{"from": "kubectl-pko", "to": "."}, {"from": "LICENSE", "to": "."}],
                    "bin": "kubectl-pko",
                }
            ],
        },
    }
    return yaml.safe_dump(manifest, sort_keys=False, width=1000)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sha256sums(directory: Path) -> str:
    """``sha256sum``'s format over every file under ``directory`` (paths relative to it, sorted)."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    return "".join(f"{sha256_of(path)}  {path.relative_to(directory).as_posix()}\n" for path in files)
