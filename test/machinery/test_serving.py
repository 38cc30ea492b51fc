"""The probe and metrics servers answer from a thread of their own, whatever the event loop does.

Each test blocks (``time.sleep``) or hogs (a pure-Python busy loop) the event loop the test runs on
while another thread sends requests, and times the answers: before the servers left the loop, every
one of them waited for the loop to come back.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pko.machinery.metrics import PrometheusWorkqueueMetrics
from pko.machinery.serving import (
    Heartbeat,
    ReadinessCheck,
    ThreadedHttpServer,
    metrics_routes,
    probe_routes,
)
from pko.machinery.workqueue import Queue

Answer = tuple[int, str, float]  # status, body, seconds it took


def get(url: str, timeout: float = 10.0) -> Answer:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status, body = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    return status, body, time.monotonic() - started


def head(url: str) -> tuple[int, bytes, str]:
    """A HEAD request: status, body, Content-Length."""
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as resp:
        return resp.status, resp.read(), resp.headers["Content-Length"]


def hog(seconds: float) -> None:
    """Keep the calling (event loop) thread busy in Python code, never yielding to the loop."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def while_loop_stuck(
    stuck: float, urls: list[str], *, after: float = 0.3, busy: bool = False
) -> list[Answer]:
    """Request ``urls`` from a thread ``after`` s into ``stuck`` s during which the loop is blocked
    (``time.sleep``) or, with ``busy``, hogged. Asserts every answer arrived before the loop was free."""
    answers: list[Answer] = []
    done_at: list[float] = []

    def probe() -> None:
        time.sleep(after)
        answers.extend(get(url) for url in urls)
        done_at.append(time.monotonic())

    thread = threading.Thread(target=probe)
    thread.start()
    if busy:
        hog(stuck)
    else:
        time.sleep(stuck)
    freed = time.monotonic()
    thread.join()
    assert done_at and done_at[0] < freed, "the answers waited for the event loop"
    return answers


class Servers:
    def __init__(
        self, heartbeat: Heartbeat, readiness: list[ReadinessCheck], registry: CollectorRegistry
    ) -> None:
        self.heartbeat = heartbeat
        self.readiness = readiness
        self.probes = ThreadedHttpServer(
            "probes", probe_routes([("ping", heartbeat.check)], readiness), "127.0.0.1", 0
        )
        self.metrics = ThreadedHttpServer("metrics", metrics_routes(registry), "127.0.0.1", 0)

    def url(self, path: str) -> str:
        server = self.metrics if path.startswith("/metrics") else self.probes
        return f"http://127.0.0.1:{server.port}{path}"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def servers(registry: CollectorRegistry) -> AsyncIterator[Servers]:
    heartbeat = Heartbeat(60.0)
    registry.register(heartbeat)
    s = Servers(heartbeat, [("informer-sync", lambda: None)], registry)
    heartbeat.start()
    s.probes.start()
    s.metrics.start()
    yield s
    await asyncio.gather(asyncio.to_thread(s.probes.stop), asyncio.to_thread(s.metrics.stop))
    heartbeat.stop()


async def test_probes_and_metrics_answer_while_the_loop_is_blocked(servers: Servers) -> None:
    answers = while_loop_stuck(3.0, [servers.url(p) for p in ("/healthz", "/readyz", "/metrics")])
    for status, _, took in answers:
        assert status == 200 and took < 1.0
    assert [body for _, body, _ in answers[:2]] == ["ok", "ok"]
    assert "pko_event_loop_heartbeat_age_seconds" in answers[2][1]


async def test_probes_answer_while_a_coroutine_hogs_the_cpu(servers: Servers) -> None:
    answers = while_loop_stuck(
        3.0, [servers.url(p) for p in ("/healthz", "/readyz", "/metrics", "/healthz")], busy=True
    )
    for status, _, took in answers:
        assert status == 200 and took < 1.0


async def test_healthz_fails_once_the_loop_is_stuck_past_the_threshold_and_recovers() -> None:
    heartbeat = Heartbeat(1.5, interval=0.2)
    s = Servers(heartbeat, [], CollectorRegistry())
    heartbeat.start()
    s.probes.start()
    try:
        assert get(s.url("/healthz"))[:2] == (200, "ok")

        # Busy but progressing: the loop gets back to its timers every half second; still alive.
        async def busy() -> None:
            for _ in range(6):
                hog(0.5)
                await asyncio.sleep(0)

        checks: list[Answer] = []

        def probe() -> None:
            for _ in range(5):
                time.sleep(0.5)
                checks.append(get(s.url("/healthz?verbose")))

        thread = threading.Thread(target=probe)
        thread.start()
        await busy()
        await asyncio.to_thread(thread.join)
        assert [c[:2] for c in checks] == [(200, "[+]ping ok\ncheck passed\n")] * 5
        assert max(c[2] for c in checks) < 1.0

        # Wedged: blocked longer than the threshold.
        [(status, body, took)] = while_loop_stuck(3.0, [s.url("/healthz")], after=2.2)
        assert status == 500 and took < 1.0
        assert body.startswith("[-]ping failed: event loop stalled: no heartbeat for ")
        assert body.endswith("(threshold 1.5s)\ncheck failed\n")

        await asyncio.sleep(0.5)  # the loop runs again, and so does its heartbeat
        assert get(s.url("/healthz"))[:2] == (200, "ok")
    finally:
        await asyncio.to_thread(s.probes.stop)
        heartbeat.stop()


async def test_readyz_lists_every_check_reads_checks_added_later_and_reports_errors(servers: Servers) -> None:
    assert get(servers.url("/readyz?verbose"))[:2] == (200, "[+]informer-sync ok\ncheck passed\n")
    servers.readiness.append(("leader", lambda: "not leading"))
    assert get(servers.url("/readyz"))[:2] == (
        500,
        "[+]informer-sync ok\n[-]leader failed: not leading\ncheck failed\n",
    )

    def broken() -> str | None:
        raise RuntimeError("boom")

    servers.readiness[1] = ("broken", broken)
    status, body, _ = get(servers.url("/readyz"))
    assert status == 500 and "[-]broken failed: error: RuntimeError('boom')" in body
    assert get(servers.url("/nope"))[0] == 404
    assert head(servers.url("/healthz")) == (200, b"", "2")


async def test_metrics_scraped_from_the_thread_while_the_loop_churns_a_queue(
    servers: Servers, registry: CollectorRegistry
) -> None:
    queue: Queue[str] = Queue("churn", metrics=PrometheusWorkqueueMetrics(registry))
    stop = threading.Event()
    scrapes: list[tuple[int, float]] = []
    failures: list[BaseException] = []

    def scrape() -> None:
        while not stop.is_set():
            try:
                # A generous timeout: on a loaded machine the churning loop and this thread share
                # one GIL; what is asserted is that every scrape answers whole, not how fast.
                status, text, _ = get(servers.url("/metrics"), timeout=60.0)
                depth = [
                    s.value
                    for f in text_string_to_metric_families(text)
                    for s in f.samples
                    if s.name == "workqueue_depth" and s.labels["name"] == "churn"
                ]
                scrapes.append((status, depth[0]))
            except BaseException as exc:
                failures.append(exc)
                return

    thread = threading.Thread(target=scrape)
    thread.start()
    try:
        # Thousands of distinct items: the queue's dicts and sets grow and shrink (and resize)
        # while the thread samples them, until it has scraped a few times (not a timed
        # assertion: a loaded machine gets fewer scrapes a second, the loop just churns longer).
        deadline = time.monotonic() + 120.0
        n = 0
        while len(scrapes) < 6 and not failures and time.monotonic() < deadline:
            for _ in range(500):
                queue.add(f"item-{n}")
                n += 1
            # (No `await asyncio.sleep(0)` here: a loop spinning on its selector drops and retakes
            # the GIL at every select(), which restarts CPython's switch interval, and starves
            # other threads; see pko.machinery.serving. A queue get with items does not suspend.)
            for _ in range(400 if len(queue) < 5000 else 600):
                queue.done(await queue.get())
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)
    assert failures == []
    assert len(scrapes) > 5 and all(status == 200 for status, _ in scrapes)
    assert max(depth for _, depth in scrapes) > 0


async def test_a_stopped_server_closes_its_port() -> None:
    server = ThreadedHttpServer("probes", probe_routes([], []), "127.0.0.1", 0)
    server.start()
    port = server.port
    assert get(f"http://127.0.0.1:{port}/healthz")[:2] == (200, "ok")
    await asyncio.to_thread(server.stop)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_heartbeat_threshold_must_exceed_its_interval() -> None:
    with pytest.raises(ValueError, match="must exceed"):
        Heartbeat(1.0, interval=1.0)
