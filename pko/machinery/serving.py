"""The manager's two small HTTP servers, probes (``/healthz``, ``/readyz``) and ``/metrics``, plus
:class:`HttpServer`, the aiohttp server other components (the program file server) run on the loop.

Why two listeners, as controller-runtime has: the kubelet probes one port and Prometheus scrapes
another, so a NetworkPolicy or a ServiceMonitor can target each alone.

Why the probes and ``/metrics`` are served from a thread of their own (:class:`ThreadedHttpServer`,
stdlib ``http.server``), not from the event loop: controller-runtime answers them from goroutines,
so a busy manager still answers. When they shared the loop, a loop busy for seconds at a time (the
first pass over 10,000 Stacks) delayed every answer by as much (a ``/metrics`` scrape once took over
5 s), and a kubelet liveness probe with its 1 s timeout would restart the operator in the middle of
that pass, again and again. The thread answers whenever it gets the GIL, which CPython hands over
every few milliseconds (``sys.getswitchinterval()``) even to a loop running pure Python; one C call
that holds the GIL for long (``json.loads`` of a huge LIST body) delays it, and so does a loop that
does little but poll its selector (``await asyncio.sleep(0)`` in a tight loop): every ``select()``
drops and retakes the GIL, which restarts the waiting thread's switch interval, so it may wait for
as long as the spinning lasts. A real first pass runs many callbacks per ``select()`` and does not
spin (over 1,000 Stacks the slowest probe answered in 0.06 s); measured, not assumed:
``hack/bench/steady.py`` prints the slowest answers.

What the answers mean, read from the thread:

* ``/healthz`` (liveness) must still fail when the loop is wedged, which merely answering no longer
  proves. A :class:`Heartbeat` timer on the loop stamps the time every second; liveness fails once
  that stamp is older than its ``stall_threshold`` (see :data:`DEFAULT_STALL_THRESHOLD` for why 60 s).
  A busy loop still runs its timers within seconds, so it stays alive.
* ``/readyz`` calls the manager's readiness checks on the thread: a check must only read simple
  state (bools, ``asyncio.Event.is_set()``, a ``list(dict.values())`` snapshot, which is one C call
  under the GIL), never await, never iterate a container the loop may resize at the same time.
* ``/metrics`` collects the registry on the thread: ``prometheus_client``'s metric types lock
  their own updates, and pko's custom collectors only take C-level snapshots of what the loop
  mutates (:mod:`pko.machinery.metrics`), so a scrape never waits for the loop. It may see an update
  half-applied (a histogram's sum a moment ahead of its buckets), never a corrupt structure.
  Callbacks given to ``Gauge.set_function`` run on that thread too (``programs_active`` reads an
  informer's ``len(indexer)``, which takes the indexer's own ``threading.RLock``). Asking the loop
  for these values instead (``run_coroutine_threadsafe``) would make a scrape wait for a busy loop
  again, which is what this module avoids.

``/metrics`` is served over HTTPS to scrapers the apiserver authenticates and authorises (as
controller-runtime's secure metrics server): :class:`ThreadedHttpServer` takes an ``ssl.SSLContext``
(:mod:`pko.machinery.servingcert`) and does each TLS handshake on the request's own thread, so a
client that stalls mid-handshake holds that thread only; :func:`metrics_routes` takes a
:class:`~pko.machinery.metricsauth.MetricsAuthorizer`, which checks each scrape on the same thread.

Addresses use Go's ``host:port`` form (``:8081`` = every interface, ``127.0.0.1:0`` = a free
loopback port); ``0`` (or an empty string) disables a server, as controller-runtime's
``--metrics-bind-address=0`` does.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, urlsplit

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from pko.machinery.metricsauth import MetricsAuthorizer

if TYPE_CHECKING:
    # Imported where used: the workspace agent serves its /metrics from this module without aiohttp.
    from aiohttp import web

__all__ = [
    "DEFAULT_STALL_THRESHOLD",
    "Heartbeat",
    "HttpServer",
    "ReadinessCheck",
    "Reply",
    "Request",
    "Route",
    "ThreadedHttpServer",
    "metrics_routes",
    "parse_bind_address",
    "probe_routes",
]

log = structlog.get_logger("pko.serving")

# A named check: returns None when fine, else the reason it fails.
ReadinessCheck = tuple[str, Callable[[], str | None]]

# Liveness fails once the event loop has not run its heartbeat for this long (seconds). Long
# enough that a loop that progresses never reaches it: a busy loop runs a due timer after at most
# one round of ready callbacks (hack/bench/steady.py prints the largest heartbeat age it saw in its
# first pass: 1.45 s over 1,000 Stacks, i.e. one beat 0.45 s late), and 10,000 Stacks' informer
# lists come in pages, not in one callback. Short enough that a wedged loop (a sync call that never
# returns: a deadlock on a threading lock, an endless loop, a blocking read without a timeout) is
# restarted within about two minutes, with the kubelet's own budget (period x failureThreshold,
# 20 s x 3 in config/manager) on top. A leader's wedged loop also stops renewing its Lease, so
# another replica takes over after the lease duration; liveness is what restarts this one.
DEFAULT_STALL_THRESHOLD: Final = 60.0
HEARTBEAT_INTERVAL: Final = 1.0
# A request's socket timeout on the probe thread: a client that stalls mid-request holds one
# request thread this long at most.
REQUEST_TIMEOUT: Final = 10.0
# How often an idle server thread checks whether it was asked to stop (socketserver's default).
POLL_INTERVAL: Final = 0.5


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


# --- the event loop's heartbeat --------------------------------------------------------------


class Heartbeat:
    """Whether the event loop still runs, as another thread can tell.

    :meth:`start` (on the loop) stamps ``time.monotonic()`` every ``interval`` seconds from a
    ``call_later`` timer; :meth:`check` (from any thread: it reads one float) fails once the stamp
    is older than ``stall_threshold``. As a collector it exports that age as
    ``pko_event_loop_heartbeat_age_seconds``, a gauge to alert on well before liveness fails.
    """

    def __init__(
        self,
        stall_threshold: float = DEFAULT_STALL_THRESHOLD,
        *,
        interval: float = HEARTBEAT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stall_threshold <= interval:
            raise ValueError(f"stall threshold {stall_threshold}s must exceed the heartbeat ({interval}s)")
        self.stall_threshold = stall_threshold
        self.interval = interval
        self._clock = clock
        self.last = clock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Begin beating on the running loop (idempotent)."""
        if self._timer is None:
            self._loop = asyncio.get_running_loop()
            self._beat()

    def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _beat(self) -> None:
        self.last = self._clock()
        assert self._loop is not None
        self._timer = self._loop.call_later(self.interval, self._beat)

    def age(self) -> float:
        """Seconds since the loop last beat."""
        return max(0.0, self._clock() - self.last)

    def check(self) -> str | None:
        """Liveness: None while the loop beats, else why it is considered wedged."""
        age = self.age()
        if age > self.stall_threshold:
            return f"event loop stalled: no heartbeat for {age:.1f}s (threshold {self.stall_threshold:g}s)"
        return None

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        family.add_metric([], self.age())
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "pko_event_loop_heartbeat_age_seconds",
            "Seconds since the event loop last ran its heartbeat timer (due every second); "
            "/healthz fails past the stall threshold.",
        )


# --- a small HTTP server on a thread of its own ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """What a route sees: the query (``?verbose`` is ``{"verbose": [""]}``) and the headers."""

    query: Mapping[str, list[str]]
    headers: Message


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# Called on a request thread, never on the event loop: see the module docstring for what it may read.
Route = Callable[[Request], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck request never holds the process up
    block_on_close = False
    routes: Mapping[str, Route]
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """On the request's thread: the TLS handshake first, bounded by the request timeout."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(REQUEST_TIMEOUT)
        with self.tls.wrap_socket(request, server_side=True) as conn:
            super().finish_request(conn, client_address)
            self.shutdown_request(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up mid-reply and the like; nothing the operator can act on.
        log.debug("probe/metrics request failed", client=str(client_address), exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT
    server_version = "pko"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _answer(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        route = self.server.routes.get(url.path)
        if route is None:
            reply = Reply(404, b"404: Not Found")
        else:
            try:
                reply = route(Request(parse_qs(url.query, keep_blank_values=True), self.headers))
            except Exception:
                log.exception("probe/metrics route failed", path=url.path)
                reply = Reply(500, b"500: Internal Server Error")
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if not head:
            self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        # No access log: probes arrive every few seconds and would drown the operator's own logs.
        return None


class ThreadedHttpServer:
    """``routes`` (path to :data:`Route`) served by a thread of its own, one more per request.

    :meth:`start` binds (so ``port`` is known when it returns; ``0`` picks a free one) and starts
    the thread; :meth:`stop` blocks up to :data:`POLL_INTERVAL` while the thread notices, so call it
    from the loop through ``asyncio.to_thread``. HTTP/1.0: one request per connection, so no idle
    keep-alive connection holds a thread.
    """

    def __init__(
        self,
        name: str,
        routes: Mapping[str, Route],
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.routes = dict(routes)
        self.tls = tls
        self.host = host
        self.port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        sock = _listen(self.host, self.port)
        try:
            # Built unbound, then handed the socket _listen made (dual-stack when the host is
            # empty). HTTPServer.server_bind is skipped on purpose: it resolves our FQDN.
            server = _Server(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        except BaseException:
            sock.close()
            raise
        server.socket.close()
        server.socket = sock
        server.routes = self.routes
        server.tls = self.tls
        self.port = int(sock.getsockname()[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL},
            name=f"pko-http-{self.name}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # waits for serve_forever to return
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _text(status: int, text: str) -> Reply:
    return Reply(status, text.encode())


def probe_routes(liveness: Sequence[ReadinessCheck], readiness: Sequence[ReadinessCheck]) -> dict[str, Route]:
    """``/healthz`` (every liveness check passes) and ``/readyz`` (every readiness check passes).

    Bodies follow the apiserver's healthz style so people reading them know the format: ``ok``,
    or one ``[+]name ok`` / ``[-]name failed: reason`` line per check, with status 500 on failure.
    ``?verbose`` lists the checks on success too. ``readiness`` may grow later (the manager's
    ``add_readiness_check``): each request reads a copy of it. A check that raises fails with the
    exception as its reason.
    """

    def report(checks: Sequence[ReadinessCheck], request: Request) -> Reply:
        lines: list[str] = []
        failed = False
        for name, check in list(checks):
            try:
                reason = check()
            except Exception as exc:
                reason = f"error: {exc!r}"
            if reason is None:
                lines.append(f"[+]{name} ok")
            else:
                failed = True
                lines.append(f"[-]{name} failed: {reason}")
        if failed:
            return _text(500, "\n".join([*lines, "check failed"]) + "\n")
        if "verbose" in request.query:
            return _text(200, "\n".join([*lines, "check passed"]) + "\n")
        return _text(200, "ok")

    return {
        "/healthz": lambda request: report(liveness, request),
        "/readyz": lambda request: report(readiness, request),
    }


def metrics_routes(
    registry: CollectorRegistry, authorizer: MetricsAuthorizer | None = None
) -> dict[str, Route]:
    """``/metrics``: ``registry`` in the Prometheus text format (or OpenMetrics when asked for),
    to every scrape ``authorizer`` lets through (all, without one).

    Collected on the request thread; see the module docstring for why that is safe.
    """

    def metrics(request: Request) -> Reply:
        if authorizer is not None:
            verdict = authorizer.check(request.headers.get("Authorization"))
            if not verdict.allowed:
                return _text(verdict.status, f"{verdict.status}: {verdict.reason}\n")
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return Reply(200, encoder(registry), content_type)

    return {"/metrics": metrics}


# --- aiohttp on the event loop (the program file server) ------------------------------------


@dataclass
class HttpServer:
    """One aiohttp application on one listening socket, on the event loop; ``port`` is known once
    started. For servers whose handlers need the loop (the program file server reads the caches)."""

    name: str
    app: web.Application
    host: str
    port: int
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        sock = _listen(self.host, self.port)
        self.port = int(sock.getsockname()[1])
        # No access log: see _Handler.log_message.
        from aiohttp import web

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
