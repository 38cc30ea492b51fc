"""A Go module proxy for tests, so the real ``go`` (``pulumi install`` -> ``go mod tidy`` and the build in
a workspace pod) fetches a Go program's modules with no proxy on the network, as in an air-gapped
cluster: a module cache's ``cache/download`` directory is laid out exactly as the GOPROXY protocol's
paths (``<module>/@v/list``, ``<version>.info``, ``.mod``, ``.zip``), so serving its files is a proxy.
Anything the cache lacks is a 404, which ``go`` reports naming the module."""

from __future__ import annotations

import contextlib
import mimetypes
import os
import subprocess
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from pko.devtools.gitserver import serve_wsgi

__all__ = ["go_sum", "serve_module_cache"]


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


def go_sum(workdir: Path, files: dict[str, str], module_cache: Path) -> bytes:
    """The go.sum (the lockfile a user commits) of the Go program ``files`` (go.mod, main.go, ...),
    written into ``workdir`` and resolved from ``module_cache`` alone, with no proxy: what
    ``pulumi install`` (``go mod tidy -compat=1.18``) will ask the served cache for."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (workdir / name).write_text(text)
    env = {**os.environ, "GOMODCACHE": str(module_cache), "GOFLAGS": "-mod=mod", "GOPROXY": "off",
           "GOSUMDB": "off", "GOTOOLCHAIN": "local"}  # fmt: skip
    subprocess.run(["go", "mod", "tidy", "-compat=1.18"], cwd=workdir, env=env, check=True)
    return (workdir / "go.sum").read_bytes()
