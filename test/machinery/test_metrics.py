"""Workqueue and controller metrics: controller-runtime's names, labels and values."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pko.machinery.delayingqueue import DelayingQueue
from pko.machinery.metrics import (
    PrometheusControllerMetrics,
    PrometheusWorkqueueMetrics,
    ReconcileOutcome,
)
from pko.machinery.ratelimit import ItemFastSlowRateLimiter
from pko.machinery.ratelimitingqueue import RateLimitingQueue
from pko.machinery.workqueue import Queue


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def sample(registry: CollectorRegistry, metric: str, /, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


async def test_workqueue_counts_adds_depth_and_durations() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    q: Queue[str] = Queue("stack-controller", metrics=PrometheusWorkqueueMetrics(registry), clock=clock)
    lbl = {"name": "stack-controller", "controller": "stack-controller"}

    q.add("a")
    q.add("b")
    q.add("a")  # duplicate: not an add
    assert sample(registry, "workqueue_adds_total", **lbl) == 2
    assert sample(registry, "workqueue_depth", **lbl) == 2

    clock.now += 0.5
    assert await q.get() == "a"
    assert sample(registry, "workqueue_depth", **lbl) == 1
    assert sample(registry, "workqueue_queue_duration_seconds_count", **lbl) == 1
    assert sample(registry, "workqueue_queue_duration_seconds_sum", **lbl) == pytest.approx(0.5)
    assert sample(registry, "workqueue_queue_duration_seconds_bucket", le="0.1", **lbl) == 0
    assert sample(registry, "workqueue_queue_duration_seconds_bucket", le="1.0", **lbl) == 1

    clock.now += 2.0
    assert sample(registry, "workqueue_unfinished_work_seconds", **lbl) == pytest.approx(2.0)
    assert sample(registry, "workqueue_longest_running_processor_seconds", **lbl) == pytest.approx(2.0)
    assert await q.get() == "b"
    clock.now += 1.0
    assert sample(registry, "workqueue_unfinished_work_seconds", **lbl) == pytest.approx(4.0)
    assert sample(registry, "workqueue_longest_running_processor_seconds", **lbl) == pytest.approx(3.0)

    q.done("a")
    q.done("b")
    assert sample(registry, "workqueue_work_duration_seconds_count", **lbl) == 2
    assert sample(registry, "workqueue_work_duration_seconds_sum", **lbl) == pytest.approx(4.0)
    assert sample(registry, "workqueue_work_duration_seconds_bucket", le="+Inf", **lbl) == 2
    assert sample(registry, "workqueue_unfinished_work_seconds", **lbl) == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds", **lbl) == 0
    assert sample(registry, "workqueue_depth", **lbl) == 0


async def test_queue_latency_of_a_requeued_item_counts_from_its_re_add() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    q: Queue[str] = Queue("q", metrics=PrometheusWorkqueueMetrics(registry), clock=clock)
    q.add("a")
    await q.get()
    clock.now += 10.0
    q.add("a")  # while processing
    clock.now += 1.0
    q.done("a")
    clock.now += 0.25
    await q.get()
    assert sample(registry, "workqueue_queue_duration_seconds_sum", name="q", controller="q") == (
        pytest.approx(1.25)
    )


async def test_retries_count_delayed_and_rate_limited_adds() -> None:
    registry = CollectorRegistry()
    q: RateLimitingQueue[str] = RateLimitingQueue(
        "q",
        metrics=PrometheusWorkqueueMetrics(registry),
        rate_limiter=ItemFastSlowRateLimiter(60.0, 60.0, 1),
    )
    q.add_after("a", 60.0)
    q.add_rate_limited("b")
    q.add_after("c", 0)
    assert sample(registry, "workqueue_retries_total", name="q", controller="q") == 3
    q.shutdown()


def test_exposition_uses_controller_runtime_names_and_labels() -> None:
    registry = CollectorRegistry()
    provider = PrometheusWorkqueueMetrics(registry)
    _q: DelayingQueue[str] = DelayingQueue("update-controller", metrics=provider)
    text = generate_latest(registry).decode()
    for name in (
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_retries_total",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    ):
        lines = [line for line in text.splitlines() if line.startswith(name + "{")]
        assert lines, name
        assert all(
            'controller="update-controller"' in ln and 'name="update-controller"' in ln for ln in lines
        )
    assert "# TYPE workqueue_queue_duration_seconds histogram" in text
    assert 'le="1e-08"' in text and 'le="1000.0"' in text


def test_a_queue_with_metrics_needs_a_name() -> None:
    with pytest.raises(ValueError, match="name"):
        Queue(metrics=PrometheusWorkqueueMetrics(CollectorRegistry()))


def test_two_workqueue_providers_on_one_registry_are_refused() -> None:
    registry = CollectorRegistry()
    PrometheusWorkqueueMetrics(registry)
    with pytest.raises(ValueError):
        PrometheusWorkqueueMetrics(registry)


async def test_a_recreated_queue_continues_its_counters_and_a_dead_one_reports_no_depth() -> None:
    registry = CollectorRegistry()
    provider = PrometheusWorkqueueMetrics(registry)
    old: Queue[str] = Queue("q", metrics=provider)
    old.add("a")
    old.add("b")
    del old
    gc.collect()
    assert sample(registry, "workqueue_depth", name="q", controller="q") == 0
    new: Queue[str] = Queue("q", metrics=provider)
    new.add("c")
    assert sample(registry, "workqueue_adds_total", name="q", controller="q") == 3
    assert sample(registry, "workqueue_depth", name="q", controller="q") == 1


def test_controller_metrics_start_every_result_at_zero() -> None:
    registry = CollectorRegistry()
    PrometheusControllerMetrics(registry).controller_metrics("stack-controller")
    for result in ("success", "error", "requeue", "requeue_after"):
        value = sample(
            registry, "controller_runtime_reconcile_total", controller="stack-controller", result=result
        )
        assert value == 0, result


def test_controller_metrics_record_outcomes_time_and_workers() -> None:
    registry = CollectorRegistry()
    m = PrometheusControllerMetrics(registry).controller_metrics("c")
    m.set_max_concurrent_reconciles(25)
    m.reconcile_started()
    m.reconcile_started()
    assert sample(registry, "controller_runtime_active_workers", controller="c") == 2
    m.reconcile_finished(ReconcileOutcome.SUCCESS, 0.2)
    m.reconcile_finished(ReconcileOutcome.TERMINAL_ERROR, 0.3)
    for outcome in (ReconcileOutcome.ERROR, ReconcileOutcome.REQUEUE, ReconcileOutcome.REQUEUE_AFTER):
        m.reconcile_started()
        m.reconcile_finished(outcome, 0.1)
    m.reconcile_started()
    m.reconcile_finished(None, 99.0)  # cancelled: frees the worker, counts nothing

    def total(result: str) -> float | None:
        return sample(registry, "controller_runtime_reconcile_total", controller="c", result=result)

    assert (total("success"), total("error"), total("requeue"), total("requeue_after")) == (1, 2, 1, 1)
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="c") == 2
    assert sample(registry, "controller_runtime_terminal_reconcile_errors_total", controller="c") == 1
    assert sample(registry, "controller_runtime_reconcile_time_seconds_count", controller="c") == 5
    assert sample(registry, "controller_runtime_reconcile_time_seconds_sum", controller="c") == pytest.approx(
        0.8
    )
    assert sample(registry, "controller_runtime_max_concurrent_reconciles", controller="c") == 25
    assert sample(registry, "controller_runtime_active_workers", controller="c") == 0
