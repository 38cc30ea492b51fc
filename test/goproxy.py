"""A Go module proxy for tests, so the real ``go`` (``pulumi install`` -> ``go mod tidy`` and the build in
a workspace pod) fetches a Go program's modules with no proxy on the network, as in an air-gapped
cluster: a module cache's ``cache/download`` directory is laid out exactly as the GOPROXY protocol's
paths (``<module>/@v/list``, ``<version>.info``, ``.mod``, ``.zip``), so serving its files is a proxy.
Anything the cache lacks is a 404, which ``go`` reports naming the module."""

from __future__ import annotations

import contextlib
import mimetypes
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from gitserver import serve_wsgi

__all__ = ["serve_module_cache"]


def _files(root: Path) -> Callable[..., Iterable[bytes]]:
    root = root.resolve()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = (root / environ.get("PATH_INFO", "/").lstrip("/")).resolve()
        if environ["REQUEST_METHOD"] != "GET" or not path.is_relative_to(root) or not path.is_file():
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        start_response("200 OK", [("Content-Type", kind), ("Content-Length", str(path.stat().st_size))])
        return [path.read_bytes()]

    return app


@contextlib.contextmanager
def serve_module_cache(download_dir: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """``download_dir`` (a module cache's ``cache/download``) served as a GOPROXY on ``host``: its URL."""
    with serve_wsgi(_files(download_dir), host) as url:
        yield url
