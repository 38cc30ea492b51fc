"""The controller runner: results, retries, errors, conflicts, concurrency, metrics, stop."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

import pko.controllers
from pko.devtools.waiting import wait_until
from pko.logging import configure_logging
from pko.machinery.controller import CONTROLLER_NAMES, DEFAULT_WORKERS, Controller, Result, TerminalError
from pko.machinery.kubeclient import ApiException  # what the operator's client raises
from pko.machinery.metrics import PrometheusControllerMetrics
from pko.machinery.ratelimit import ItemExponentialFailureRateLimiter
from pko.machinery.ratelimitingqueue import RateLimitingQueue

TIMEOUT = 10.0  # generous: the machine is shared; nothing here asserts speed

Behaviour = Callable[[str, int], Awaitable[Result]]


class ScriptedReconciler:
    """Runs ``behaviour(key, attempt)`` and records every call."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[str, float]] = []

    def attempts(self, key: str) -> int:
        return sum(1 for k, _ in self.calls if k == key)

    async def reconcile(self, key: str) -> Result:
        attempt = self.attempts(key)
        self.calls.append((key, asyncio.get_running_loop().time()))
        return await self.behaviour(key, attempt)


def fast_queue(name: str) -> RateLimitingQueue[str]:
    return RateLimitingQueue(name, rate_limiter=ItemExponentialFailureRateLimiter(0.001, 0.01))


# Polls a condition of the system under test (no event exists for it), often, with a generous limit.
eventually = functools.partial(
    wait_until, "a condition of the system under test", within=TIMEOUT, interval=0.001
)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def run(registry: CollectorRegistry) -> AsyncIterator[Callable[..., Controller]]:
    """Build and start controllers (sharing one metrics provider) that are stopped at the end."""
    metrics = PrometheusControllerMetrics(registry)
    started: list[Controller] = []

    def make(reconciler: Any, workers: int = 1) -> Controller:
        name = f"test-{uuid.uuid4().hex[:8]}"
        c = Controller(name, reconciler, fast_queue(name), workers=workers, metrics=metrics)
        started.append(c)
        c.start()
        return c

    yield make
    for c in started:
        await c.stop(grace_period=1.0)


def total(registry: CollectorRegistry, controller: str, result: str) -> float | None:
    return registry.get_sample_value(
        "controller_runtime_reconcile_total", {"controller": controller, "result": result}
    )


def errors(registry: CollectorRegistry, controller: str) -> float | None:
    return registry.get_sample_value("controller_runtime_reconcile_errors_total", {"controller": controller})


async def done(key: str, attempt: int) -> Result:
    return Result.done()


# --- results ---------------------------------------------------------------------------------


async def test_success_is_counted_and_forgets_the_backoff(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    rec = ScriptedReconciler(done)
    c = run(rec)
    c.queue.rate_limiter.when("ns/a")  # some earlier failure history
    c.queue.add("ns/a")
    await eventually(lambda: total(registry, c.name, "success") == 1)
    assert rec.calls[0][0] == "ns/a"
    assert c.queue.num_requeues("ns/a") == 0


async def test_an_exception_is_logged_with_the_key_counted_and_retried_with_backoff(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def flaky(key: str, attempt: int) -> Result:
        if attempt < 2:
            raise RuntimeError(f"boom {attempt}")
        return Result.done()

    rec = ScriptedReconciler(flaky)
    with capture_logs() as logs:
        c = run(rec)
        c.queue.add("ns/a")
        await eventually(lambda: total(registry, c.name, "success") == 1)
    assert rec.attempts("ns/a") == 3
    assert total(registry, c.name, "error") == 2
    assert errors(registry, c.name) == 2
    failures = [e for e in logs if e["event"] == "Reconciler error"]
    assert len(failures) == 2
    assert all(
        e["key"] == "ns/a" and e["controller"] == c.name and e["log_level"] == "error" for e in failures
    )
    assert [str(e["exc_info"]) for e in failures] == ["boom 0", "boom 1"]
    assert c.queue.num_requeues("ns/a") == 0, "success must reset the backoff"


async def test_a_conflict_is_a_quiet_requeue_not_an_error(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def conflicting(key: str, attempt: int) -> Result:
        if attempt == 0:
            raise ApiException(status=409, reason="Conflict")
        return Result.done()

    rec = ScriptedReconciler(conflicting)
    with capture_logs() as logs:
        c = run(rec)
        c.queue.add("ns/a")
        await eventually(lambda: total(registry, c.name, "success") == 1)
    assert rec.attempts("ns/a") == 2
    assert total(registry, c.name, "requeue") == 1
    assert total(registry, c.name, "error") == 0 and errors(registry, c.name) == 0
    assert [e["log_level"] for e in logs if e["log_level"] not in ("debug", "info")] == []
    assert any(e["event"] == "Conflict, requeueing" and e["key"] == "ns/a" for e in logs)


async def test_other_api_errors_are_errors(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def forbidden(key: str, attempt: int) -> Result:
        if attempt == 0:
            raise ApiException(status=403, reason="Forbidden")
        return Result.done()

    c = run(ScriptedReconciler(forbidden))
    c.queue.add("ns/a")
    await eventually(lambda: total(registry, c.name, "success") == 1)
    assert total(registry, c.name, "error") == 1


async def test_requeue_after_waits_and_resets_the_backoff(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    backoff_seen: list[int] = []

    async def timer(key: str, attempt: int) -> Result:
        backoff_seen.append(c.queue.num_requeues(key))
        if attempt == 0:
            raise RuntimeError("fail once")
        if attempt == 1:
            return Result.requeue_after(0.05)
        return Result.done()

    rec = ScriptedReconciler(timer)
    c = run(rec)
    c.queue.add("ns/a")
    await eventually(lambda: total(registry, c.name, "success") == 1)
    (_, t1), (_, t2) = rec.calls[1], rec.calls[2]
    assert t2 - t1 >= 0.05
    assert backoff_seen == [0, 1, 0], "requeue_after forgets the failure history"
    assert total(registry, c.name, "requeue_after") == 1


async def test_requeue_is_a_rate_limited_retry_without_an_error(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def again(key: str, attempt: int) -> Result:
        return Result.requeue() if attempt < 2 else Result.done()

    with capture_logs() as logs:
        c = run(ScriptedReconciler(again))
        c.queue.add("ns/a")
        await eventually(lambda: total(registry, c.name, "success") == 1)
    assert total(registry, c.name, "requeue") == 2
    assert errors(registry, c.name) == 0
    assert not [e for e in logs if e["log_level"] == "error"]


async def test_a_terminal_error_is_counted_but_not_retried(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def invalid(key: str, attempt: int) -> Result:
        raise TerminalError("spec.stack is required")

    rec = ScriptedReconciler(invalid)
    c = run(rec)
    c.queue.add("ns/a")
    await eventually(lambda: total(registry, c.name, "error") == 1)
    await eventually(lambda: c.queue.processing == 0)
    assert c.queue.waiting() == 0 and len(c.queue) == 0
    assert (
        registry.get_sample_value(
            "controller_runtime_terminal_reconcile_errors_total", {"controller": c.name}
        )
        == 1
    )
    assert rec.attempts("ns/a") == 1


async def test_returning_something_other_than_a_result_is_an_error(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def sloppy(key: str, attempt: int) -> Any:
        return None if attempt == 0 else Result.done()

    c = run(ScriptedReconciler(sloppy))
    c.queue.add("ns/a")
    await eventually(lambda: total(registry, c.name, "success") == 1)
    assert total(registry, c.name, "error") == 1


async def test_a_cancelled_await_inside_reconcile_is_an_error_not_a_stop(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    async def cancelled_inside(key: str, attempt: int) -> Result:
        if attempt == 0:
            inner = asyncio.get_running_loop().create_future()
            inner.cancel()
            await inner  # raises CancelledError although nobody is stopping the worker
        return Result.done()

    c = run(ScriptedReconciler(cancelled_inside))
    c.queue.add("ns/a")
    await eventually(lambda: total(registry, c.name, "success") == 1)
    assert total(registry, c.name, "error") == 1
    assert c.running


# --- concurrency -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
async def test_no_key_is_reconciled_twice_at_once_and_no_add_is_lost(
    run: Callable[..., Controller], seed: int
) -> None:
    rng = random.Random(seed)
    keys = [f"ns/k{i}" for i in range(12)]
    holders: dict[str, int] = {}
    overlaps: list[str] = []
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    tick = 0

    async def busy(key: str, attempt: int) -> Result:
        nonlocal tick
        holders[key] = holders.get(key, 0) + 1
        if holders[key] > 1:
            overlaps.append(key)
        tick += 1
        last_start[key] = tick
        for _ in range(rng.randint(0, 4)):
            await asyncio.sleep(0)
        if rng.random() < 0.2:
            tick += 1
            last_add[key] = tick
            c.queue.add(key)  # our own write triggers another event for the same key
        holders[key] -= 1
        if rng.random() < 0.1:
            raise RuntimeError("transient")
        return Result.done()

    c = run(ScriptedReconciler(busy), workers=5)
    for _ in range(300):
        key = rng.choice(keys)
        tick += 1
        last_add[key] = tick
        c.queue.add(key)
        for _ in range(rng.randint(0, 2)):
            await asyncio.sleep(0)
    await eventually(lambda: len(c.queue) == 0 and c.queue.processing == 0 and c.queue.waiting() == 0)
    assert not overlaps
    for key, added in last_add.items():
        assert last_start.get(key, -1) > added, f"{key} was added after its last reconcile"


async def test_active_workers_and_max_concurrency_are_reported(
    run: Callable[..., Controller], registry: CollectorRegistry
) -> None:
    release = asyncio.Event()

    async def blocked(key: str, attempt: int) -> Result:
        await release.wait()
        return Result.done()

    c = run(ScriptedReconciler(blocked), workers=3)
    for i in range(5):
        c.queue.add(f"ns/k{i}")
    await eventually(lambda: c.active_workers == 3)
    gauge = {"controller": c.name}
    assert registry.get_sample_value("controller_runtime_active_workers", gauge) == 3
    assert registry.get_sample_value("controller_runtime_max_concurrent_reconciles", gauge) == 3
    assert len(c.queue) == 2
    release.set()
    await eventually(lambda: total(registry, c.name, "success") == 5)
    await eventually(lambda: c.active_workers == 0)
    assert registry.get_sample_value("controller_runtime_active_workers", gauge) == 0


# --- stop ---------------------------------------------------------------------------------------


async def test_stop_lets_in_flight_reconciles_finish_and_takes_no_new_keys(
    registry: CollectorRegistry,
) -> None:
    release = asyncio.Event()

    async def blocked(key: str, attempt: int) -> Result:
        await release.wait()
        return Result.done()

    rec = ScriptedReconciler(blocked)
    c = Controller("stopper", rec, fast_queue("stopper"), metrics=PrometheusControllerMetrics(registry))
    c.start()
    c.queue.add("ns/in-flight")
    await eventually(lambda: c.active_workers == 1)
    c.queue.add("ns/queued")
    stopping = asyncio.create_task(c.stop(grace_period=TIMEOUT))
    await asyncio.sleep(0.01)
    assert not stopping.done() and not c.running
    release.set()
    async with asyncio.timeout(TIMEOUT):
        await stopping
    assert [k for k, _ in rec.calls] == ["ns/in-flight"]
    assert total(registry, "stopper", "success") == 1
    assert len(c.queue) == 1, "ns/queued stays queued, untouched"
    c.queue.add("ns/late")
    assert len(c.queue) == 1, "a stopped controller's queue refuses new keys"


async def test_stop_cancels_reconciles_that_outlive_the_grace_period(registry: CollectorRegistry) -> None:
    cancelled = asyncio.Event()

    async def stuck(key: str, attempt: int) -> Result:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Result.done()

    c = Controller(
        "stuck", ScriptedReconciler(stuck), fast_queue("stuck"), workers=2,
        metrics=PrometheusControllerMetrics(registry),
    )  # fmt: skip
    c.start()
    c.queue.add("ns/a")
    await eventually(lambda: c.active_workers == 1)
    async with asyncio.timeout(TIMEOUT):
        await c.stop(grace_period=0.05)
    assert cancelled.is_set()
    assert c.active_workers == 0 and c.queue.processing == 0
    assert registry.get_sample_value("controller_runtime_active_workers", {"controller": "stuck"}) == 0
    assert total(registry, "stuck", "error") == 0, "a cancelled reconcile is not an error"


async def test_a_stopped_controller_cannot_be_restarted_and_start_twice_is_refused() -> None:
    c = Controller("once", ScriptedReconciler(done))
    c.start()
    with pytest.raises(RuntimeError, match="already running"):
        c.start()
    await c.stop(grace_period=1.0)
    with pytest.raises(RuntimeError, match="stopped"):
        c.start()


def test_a_controller_needs_a_worker() -> None:
    with pytest.raises(ValueError):
        Controller("none", ScriptedReconciler(done), workers=0)


def test_default_worker_counts_match_the_go_operator() -> None:
    # MAX_CONCURRENT_RECONCILES: 25 for every controller, keyed by the one list of names.
    assert DEFAULT_WORKERS == {
        "stack-controller": 25,
        "workspace-controller": 25,
        "update-controller": 25,
        "program-controller": 25,
    }
    assert tuple(DEFAULT_WORKERS) == CONTROLLER_NAMES
    assert pko.controllers.CONTROLLER_NAMES is CONTROLLER_NAMES


# --- result ---------------------------------------------------------------------------------------


def test_result_constructors() -> None:
    assert Result.done() == Result()
    assert Result.requeue().kind == "requeue"
    assert Result.requeue_after(2.5) == Result("requeue_after", 2.5)
    assert Result.requeue_after(-3) == Result("requeue_after", 0.0), "a deadline already past means now"
    with pytest.raises(ValueError):
        Result.requeue_after(float("nan"))


# --- logging context ------------------------------------------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
async def test_reconciler_logs_carry_the_controller_key_and_reconcile_id() -> None:
    async def chatty(key: str, attempt: int) -> Result:
        structlog.get_logger().info("creating workspace")
        logging.getLogger("some.library").warning("library says hi")
        return Result.done()

    # Built before logging is configured, as a manager may do: it must still log the configured way.
    c = Controller("stack-controller", ScriptedReconciler(chatty), fast_queue("stack-controller"))
    out = io.StringIO()
    configure_logging("debug", "json", stream=out)
    c.start()
    c.queue.add("default/my-stack")
    await eventually(lambda: "Reconcile finished" in out.getvalue())
    await c.stop(grace_period=1.0)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert any(e["msg"] == "Starting workers" and e["controller"] == "stack-controller" for e in lines)
    ours = next(e for e in lines if e["msg"] == "creating workspace")
    assert ours["controller"] == "stack-controller" and ours["key"] == "default/my-stack"
    assert ours["level"] == "info" and "ts" in ours and ours["reconcile_id"]
    lib = next(e for e in lines if e["msg"] == "library says hi")
    assert lib["key"] == "default/my-stack" and lib["logger"] == "some.library"
    finished = next(e for e in lines if e["msg"] == "Reconcile finished")
    assert finished["reconcile_id"] == ours["reconcile_id"] and finished["result"] == "success"


# --- against a real apiserver ---------------------------------------------------------------------


@pytest.mark.cluster
async def test_a_real_409_from_the_apiserver_is_a_quiet_requeue(
    api_client: Any, registry: CollectorRegistry
) -> None:
    from pko.machinery.resource import CONFIGMAPS, ResourceClient

    cms = ResourceClient(api_client, CONFIGMAPS, "default")  # the operator's client, as a reconciler's
    name = f"conflict-{uuid.uuid4().hex[:8]}"
    await cms.create({"metadata": {"name": name}, "data": {"n": "0"}})

    async def write_with_optimistic_concurrency(key: str, attempt: int) -> Result:
        namespace, cm_name = key.split("/")
        cm = await cms.get(cm_name, namespace)
        if attempt == 0:  # someone else writes between our read and our write
            theirs = await cms.get(cm_name, namespace)
            theirs["data"]["other"] = "writer"
            await cms.replace(theirs)
        cm["data"]["n"] = "1"
        await cms.replace(cm)  # carries cm's resourceVersion
        return Result.done()

    rec = ScriptedReconciler(write_with_optimistic_concurrency)
    c = Controller("cm-writer", rec, fast_queue("cm-writer"), metrics=PrometheusControllerMetrics(registry))
    try:
        with capture_logs() as logs:
            c.start()
            c.queue.add(f"default/{name}")
            await eventually(lambda: total(registry, "cm-writer", "success") == 1)
    finally:
        await c.stop(grace_period=5.0)
        await cms.delete(name, "default")
    assert rec.attempts(f"default/{name}") == 2
    assert total(registry, "cm-writer", "requeue") == 1 and errors(registry, "cm-writer") == 0
    assert not [e for e in logs if e["log_level"] == "error"]
