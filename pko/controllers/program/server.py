"""The Program artifact server: ``GET /programs/<ns>/<name>/<generation>[.tar.gz]`` from any replica.

The Go operator writes each artifact to the leader's disk and serves that directory, so only the
leader can answer and a restart loses the files until the next reconcile. Here the bytes are a
pure function of the Program (:mod:`pko.controllers.program.artifact`), so every replica rebuilds them from
its own Program informer cache: the Service in front of the operator may route a workspace's
download to any pod, before or after a failover, and the answer is the same.

Answers: 200 with the tarball (``application/gzip``, ``ETag`` = the digest) when the cached
Program has exactly that generation and is valid; 404 otherwise (unknown Program, another
generation, an invalid body; there is no directory listing); 503 until the cache has synced, so a
fetcher retries instead of taking a 404 that a warm cache would not give. HEAD is answered too.
"""

from __future__ import annotations

import asyncio
import os
from typing import Final

import structlog
from aiohttp import web

from pko.controllers.program.artifact import ArtifactCache, InvalidProgram
from pko.machinery.informer import SharedInformer
from pko.machinery.serving import HttpServer, parse_bind_address
from pko.machinery.store import object_key

__all__ = ["DEFAULT_ADDRESS", "ProgramServer", "advertised_address"]

DEFAULT_ADDRESS: Final = ":9090"
CONTENT_TYPE: Final = "application/gzip"
_SUFFIX: Final = ".tar.gz"

log = structlog.get_logger("pko.controllers.program.server")


def advertised_address(configured: str, bound: tuple[str, int] | None) -> str:
    """The address workspaces reach the server at: ``configured`` when set, else the bound one.

    As Flux's source-controller does for its storage address: a wildcard host becomes this host's
    name (the pod name, resolvable through a headless Service), the port is the one bound.
    """
    if configured:
        return configured
    if bound is None:
        raise ValueError("the program file server is disabled and no advertised address is set")
    host, port = bound
    if host in ("", "0.0.0.0", "::"):
        host = os.uname().nodename
    elif ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


class ProgramServer:
    """Serves Program artifacts from ``informer``'s cache on ``address`` (Go ``host:port``).

    Run :meth:`run` as a manager runnable on every replica; :meth:`wait_serving` then gives the
    bound address (useful with port 0). ``cache`` is shared with the controller, so an artifact
    whose digest was just recorded is usually served without rebuilding.
    """

    def __init__(
        self, informer: SharedInformer, cache: ArtifactCache, address: str = DEFAULT_ADDRESS
    ) -> None:
        self.informer = informer
        self.cache = cache
        self.bind = parse_bind_address(address)
        self._server: HttpServer | None = None
        self._serving = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        # aiohttp answers HEAD on GET routes (allow_head), with the same headers and no body.
        app.router.add_get("/programs/{namespace}/{name}/{file}", self._artifact)
        return app

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)`` while serving."""
        return (self._server.host, self._server.port) if self._server is not None else None

    async def wait_serving(self) -> tuple[str, int] | None:
        """The bound address once listening; None at once when the server is disabled."""
        if self.bind is None:
            return None
        await self._serving.wait()
        return self.address

    async def run(self) -> None:
        """Listen until cancelled (a disabled server, address ``0``, just waits)."""
        bind = self.bind
        if bind is None:
            await asyncio.Future()
            return
        server = HttpServer("program-fs", self.app(), *bind)
        await server.start()
        self._server = server
        self._serving.set()
        log.info("serving program artifacts", address=f"{server.host or '*'}:{server.port}")
        try:
            await asyncio.Future()
        finally:
            self._serving.clear()
            self._server = None
            await server.stop()

    async def _artifact(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        generation_text = request.match_info["file"].removesuffix(_SUFFIX)
        if not generation_text.isdigit():
            raise web.HTTPNotFound()
        if not self.informer.has_synced():
            raise web.HTTPServiceUnavailable(
                text="program cache not synced yet\n", headers={"Retry-After": "1"}
            )
        obj = self.informer.indexer.get_by_key(object_key(namespace, name))
        if obj is None or int((obj.get("metadata") or {}).get("generation") or 0) != int(generation_text):
            raise web.HTTPNotFound()
        try:
            artifact = self.cache.get(obj)
        except InvalidProgram:
            raise web.HTTPNotFound() from None
        etag = f'"{artifact.digest}"'
        if request.headers.get("If-None-Match") == etag:
            raise web.HTTPNotModified(headers={"ETag": etag})
        return web.Response(
            body=artifact.data,
            headers={
                "Content-Type": CONTENT_TYPE,
                "ETag": etag,
                # A generation's bytes never change: caches may keep them.
                "Cache-Control": "public, max-age=31536000, immutable",
            },
        )
