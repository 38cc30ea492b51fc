"""The manager's two small HTTP servers: probes (``/healthz``, ``/readyz``) and ``/metrics``.

Why two listeners, as controller-runtime has: the kubelet probes one port and Prometheus scrapes
another, so a NetworkPolicy or a ServiceMonitor can target each alone. Both run on the manager's
event loop (aiohttp): a probe answered from that loop also proves the loop is not wedged.

Addresses use Go's ``host:port`` form (``:8081`` = every interface, ``127.0.0.1:0`` = a free
loopback port); ``0`` (or an empty string) disables a server, as controller-runtime's
``--metrics-bind-address=0`` does.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["HttpServer", "ReadinessCheck", "metrics_app", "parse_bind_address", "probes_app"]

# A named check: returns None when fine, else the reason it fails.
ReadinessCheck = tuple[str, Callable[[], str | None]]


def parse_bind_address(address: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` too) to ``(host, port)``; ``None`` when the server is disabled.

    An empty host means every interface.
    """
    address = address.strip()
    if address in ("", "0"):
        return None
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise ValueError(f"bind address {address!r} is not host:port (e.g. ':8081' or '127.0.0.1:8081')")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bind address {address!r} has no numeric port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bind address {address!r}: port out of range")
    return host, port


def _listen(host: str, port: int) -> socket.socket:
    if host in ("", "0.0.0.0", "::") and socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, reuse_port=False)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


@dataclass
class HttpServer:
    """One aiohttp application on one listening socket; ``port`` is known once started."""

    name: str
    app: web.Application
    host: str
    port: int
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        sock = _listen(self.host, self.port)
        self.port = int(sock.getsockname()[1])
        # No access log: probes arrive every few seconds and would drown the operator's own logs.
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def probes_app(is_alive: Callable[[], str | None], readiness: list[ReadinessCheck]) -> web.Application:
    """``/healthz`` (liveness) and ``/readyz`` (every readiness check passes).

    Bodies follow the apiserver's healthz style so people reading them know the format: ``ok``,
    or one ``[+]name ok`` / ``[-]name failed: reason`` line per check, with status 500 on failure.
    ``?verbose`` lists the checks on success too.
    """

    def report(checks: list[ReadinessCheck], request: web.Request) -> web.Response:
        lines: list[str] = []
        failed = False
        for name, check in checks:
            reason = check()
            if reason is None:
                lines.append(f"[+]{name} ok")
            else:
                failed = True
                lines.append(f"[-]{name} failed: {reason}")
        if failed:
            return web.Response(status=500, text="\n".join([*lines, "check failed"]) + "\n")
        if "verbose" in request.query:
            return web.Response(text="\n".join([*lines, "check passed"]) + "\n")
        return web.Response(text="ok")

    async def healthz(request: web.Request) -> web.Response:
        return report([("ping", is_alive)], request)

    async def readyz(request: web.Request) -> web.Response:
        return report(readiness, request)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app(registry: CollectorRegistry) -> web.Application:
    """``/metrics``: ``registry`` in the Prometheus text format (or OpenMetrics when asked for).

    Collected on the event loop thread: the workqueue collector samples queues that only that
    thread mutates, and a scrape of a few controllers' series takes about a millisecond.
    """

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app
