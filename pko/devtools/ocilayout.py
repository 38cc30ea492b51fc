"""An image from an OCI archive (what hack/build-images.sh writes), labelled and pushed by digest.

Why labels are added here and not at build time: the images are cached by their inputs' hash, and the
release labels (``org.opencontainers.image.version``, ``.revision``, ``.source``) would make every commit
a new build. Adding them rewrites only the image config (and so the manifest); the layers, the bulk of an
image, are pushed byte for byte as built, so the release's images are the cached builds of its commit.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pko.devtools.ociclient import Registry, RegistryError, digest_of

__all__ = ["PushedImage", "push_archive"]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class PushedImage:
    repository: str  # HOST/PATH/NAME
    tag: str
    digest: str  # of the manifest

    @property
    def pinned(self) -> str:
        """``HOST/PATH/NAME:TAG@sha256:...``: the tag for people, the digest for the kubelet."""
        return f"{self.repository}:{self.tag}@{self.digest}"


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hex_digest = digest.partition(":")
    return layout / "blobs" / algorithm / hex_digest


def _read_manifest(layout: Path) -> dict[str, Any]:
    index = json.loads((layout / "index.json").read_text())
    manifests = index.get("manifests") or []
    if len(manifests) != 1 or manifests[0].get("mediaType") != OCI_MANIFEST:
        raise RegistryError(f"{layout}: expected one OCI image manifest in index.json, found {manifests}")
    manifest: dict[str, Any] = json.loads(_blob(layout, manifests[0]["digest"]).read_bytes())
    return manifest


def push_archive(
    archive: Path, registry: Registry, repository: str, tag: str, labels: Mapping[str, str]
) -> PushedImage:
    """Push the single image of ``archive`` to ``registry`` as ``repository:tag``, with ``labels`` added to
    its config (the registry checks every blob against the digest it is uploaded as)."""
    with tempfile.TemporaryDirectory(prefix="pko-release-") as tmp:
        layout = Path(tmp)
        with tarfile.open(archive) as tar:
            tar.extractall(layout, filter="data")
        manifest = _read_manifest(layout)
        config = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())
        config.setdefault("config", {})
        config["config"]["Labels"] = {**(config["config"].get("Labels") or {}), **labels}
        config_bytes = json.dumps(config, separators=(",", ":"), sort_keys=True).encode()
        config_digest = digest_of(config_bytes)
        config_path = _blob(layout, config_digest)
        config_path.write_bytes(config_bytes)
        manifest["config"] = {**manifest["config"], "digest": config_digest, "size": len(config_bytes)}
        for layer in manifest["layers"]:
            path = _blob(layout, layer["digest"])
            if path.stat().st_size != layer["size"]:
                raise RegistryError(f"{archive}: layer {layer['digest']} has the wrong size")
            registry.push_blob(repository, layer["digest"], path)
        registry.push_blob(repository, config_digest, config_path)
        manifest_bytes = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
        digest = registry.push_manifest(repository, tag, manifest_bytes, OCI_MANIFEST)
    return PushedImage(f"{registry.host}/{repository}", tag, digest)
