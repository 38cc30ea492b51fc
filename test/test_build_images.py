"""hack/up.sh builds and imports only the image set ``sample`` of hack/build-images.sh, and the S3 sample's
image only when asked (``s3``), so a newcomer's first Stack does not wait for SeaweedFS (5 minutes cold,
issue 45). These sets must hold exactly what the manifests run: an image missing from ``sample`` is a
sample that never starts on the node (ErrImageNeverPull); one too many is minutes of build for nothing."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "hack" / "build-images.sh"


def _set(name: str) -> set[str]:
    """The archives of a set, as build-images.sh declares it (``NAME_IMAGES=(...)``)."""
    found = re.search(rf"^{name}_IMAGES=\(([^)]*)\)", SCRIPT.read_text(), re.MULTILINE)
    assert found, f"no {name}_IMAGES=(...) in hack/build-images.sh"
    return set(found.group(1).split())


def _references(node: Any) -> Iterator[str]:
    """The image references in a manifest: every string ``image`` (pods, and the pods a Program's
    resources make) and every ``*_IMAGE`` environment variable (the operator's agent and workspace images)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            elif key == "env" and isinstance(value, list):
                yield from (
                    e["value"] for e in value if str(e.get("name", "")).endswith("_IMAGE") and "value" in e
                )
            yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


def _archives(*directories: str) -> set[str]:
    """The archives the node needs for what ``kubectl kustomize DIRECTORY`` renders: build-images.sh names
    each archive by its image's repository (``localhost/pko-seaweedfs:dev`` -> ``pko-seaweedfs``)."""
    names = set()
    for directory in directories:
        out = subprocess.run(
            ["kubectl", "kustomize", str(REPO / directory)], check=True, capture_output=True, text=True
        ).stdout
        for obj in yaml.safe_load_all(out):
            if obj and obj.get("kind") != "CustomResourceDefinition":
                names |= {ref.rsplit("/", 1)[-1].split("@")[0].split(":")[0] for ref in _references(obj)}
    return names


def test_the_sample_set_is_what_up_sh_installs_and_its_sample_runs() -> None:
    assert _archives("config/local", "config/samples") == _set("SAMPLE")


def test_the_s3_set_is_what_the_s3_sample_adds() -> None:
    assert _archives("config/samples/s3") - _set("SAMPLE") == _set("S3")


def test_up_sh_asks_for_the_sample_set_and_s3_only_when_told() -> None:
    script = (REPO / "hack" / "up.sh").read_text()
    assert re.search(r"^SETS=\(sample\)$", script, re.MULTILINE)
    assert 'bash hack/build-images.sh "${SETS[@]}"' in script
    assert 'localnode.py up "${IMPORTS[@]}"' in script  # only what was built, not the whole cache
