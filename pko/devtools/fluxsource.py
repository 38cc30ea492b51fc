"""A stand-in for Flux's source-controller, for tests of ``spec.fluxSource``: the GitRepository CRD
alone (any spec, a status subresource), a tarball artifact of some files as source-controller packs a
repository, and the status source-controller writes when it has stored one (``artifact`` with url,
digest and revision; ``Ready``). The test serves the tarball itself and writes the status; nothing
clones anything. What pko reads of a Flux source is exactly that status, so this proves pko's side;
Flux's own behaviour is Flux's to test."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["GITREPOSITORY_CRD", "artifact_app", "artifact_status", "tarball"]

GITREPOSITORY_CRD: Final[dict[str, Any]] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gitrepositories.source.toolkit.fluxcd.io"},
    "spec": {
        "group": "source.toolkit.fluxcd.io",
        "scope": "Namespaced",
        "names": {
            "plural": "gitrepositories",
            "singular": "gitrepository",
            "kind": "GitRepository",
            "listKind": "GitRepositoryList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def tarball(files: Mapping[str, bytes]) -> tuple[bytes, str]:
    """``files`` (path -> content) as a gzipped tarball, and its digest (``sha256:<hex>``)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for path, content in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    data = raw.getvalue()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def artifact_status(url: str, digest: str, revision: str, generation: int, now: str) -> dict[str, Any]:
    """The ``status`` of a source whose artifact at ``url`` is stored, for its ``generation`` (``now``:
    an RFC 3339 time)."""
    return {
        "observedGeneration": generation,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Succeeded",
                "message": f"stored artifact for revision '{revision}'",
                "lastTransitionTime": now,
                "observedGeneration": generation,
            }
        ],
        "artifact": {"url": url, "digest": digest, "revision": revision, "lastUpdateTime": now},
    }


def artifact_app(path: str, body: bytes) -> Callable[..., list[bytes]]:
    """A WSGI app serving ``body`` at ``path`` (source-controller's artifact server, for one artifact);
    serve it with :func:`pko.devtools.gitserver.serve_wsgi`."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        start_response("200 OK", [("Content-Type", "application/gzip"), ("Content-Length", str(len(body)))])
        return [body]

    return app
