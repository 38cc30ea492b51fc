"""Workqueue and controller metrics, named and labelled as controller-runtime names them.

Platform teams already have dashboards and alerts on controller-runtime's series, so we export
the same names: ``workqueue_*`` labelled ``name`` (and ``controller``, same value, as current
controller-runtime does) and ``controller_runtime_*`` labelled ``controller``.

The queue and the controller only see small provider interfaces (:class:`WorkqueueMetricsProvider`,
:class:`ControllerMetricsProvider`); nothing here is global. The Prometheus providers write into a
``prometheus_client.CollectorRegistry`` passed in (default: the process-wide ``REGISTRY`` that the
metrics endpoint serves). Create one provider of each kind per registry: a second one on the same
registry is a duplicate registration and raises ``ValueError``.

Why the workqueue side is a custom collector: the queue is touched several times per item, and
``prometheus_client``'s metric objects take a thread lock on every update (about 0.5-1.3 us each),
which alone would cap the queue well below its throughput target. The queue is only ever used from
the event loop thread, so :class:`PrometheusWorkqueueMetrics` keeps plain counters and histogram
buckets and turns them into metric families when scraped. Depth, unfinished work and the longest
running processor are sampled from the queue at scrape time (client-go polls them every 500ms), so
they cost nothing per operation. A scrape runs on another thread (the manager's metrics server has
one of its own, so a scrape never waits for a busy loop: :mod:`pko.machinery.serving`); it only
reads (snapshots taken with single C-level calls under the GIL: ``list(dict.items())``, ``len()``
of a deque, ``list()`` of a bucket list), never iterates in Python a container the loop may resize
meanwhile, so a scrape may see one update half-applied (a histogram sum a moment ahead of its
buckets), never a corrupt structure or "dictionary changed size during iteration".
"""

from __future__ import annotations

import enum
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

# prometheus_client's own Go-style float formatting (the `le` label); the library leaves it untyped.
_go_float: Callable[[float], str] = floatToGoString

__all__ = [
    "RECONCILE_TIME_BUCKETS",
    "WORKQUEUE_BUCKETS",
    "ControllerMetrics",
    "ControllerMetricsProvider",
    "NoopControllerMetrics",
    "PrometheusControllerMetrics",
    "PrometheusWorkqueueMetrics",
    "QueueMetrics",
    "QueueProbe",
    "ReconcileOutcome",
    "WorkqueueMetricsProvider",
]

# controller-runtime: prometheus.ExponentialBuckets(10e-9, 10, 12).
WORKQUEUE_BUCKETS: tuple[float, ...] = (
    1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0,
)  # fmt: skip
# controller-runtime's controller_runtime_reconcile_time_seconds buckets.
RECONCILE_TIME_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
)  # fmt: skip


# --- workqueue ---------------------------------------------------------------------------------


class QueueProbe(Protocol):
    """What a metrics provider may sample from a queue when scraped (from any thread)."""

    def __len__(self) -> int:
        """Items waiting for a worker (the depth)."""
        ...

    def processing_ages(self) -> list[float]:
        """Seconds each item currently being processed has been processing."""
        ...


class QueueMetrics(Protocol):
    """Per-queue event sink. Called from the event loop thread on the queue's hot path."""

    def added(self) -> None:
        """A new item was accepted (not a duplicate of a queued one)."""
        ...

    def retried(self) -> None:
        """An item was scheduled for a later retry (``add_after``/``add_rate_limited``)."""
        ...

    def observe_queue_latency(self, seconds: float) -> None:
        """An item waited ``seconds`` between being added and handed to a worker."""
        ...

    def observe_work_duration(self, seconds: float) -> None:
        """A worker held an item for ``seconds`` (get to done)."""
        ...


class WorkqueueMetricsProvider(Protocol):
    """Hands each named queue its event sink; samples depth etc. through ``probe``."""

    def queue_metrics(self, name: str, probe: QueueProbe) -> QueueMetrics: ...


_HIST_SIZE = len(WORKQUEUE_BUCKETS) + 1  # one slot per bucket plus +Inf


class _QueueSeries:
    """Plain-number accumulators for one queue name (no locks: see the module docstring)."""

    __slots__ = ("adds", "latency_counts", "latency_sum", "probe", "retries", "work_counts", "work_sum")

    def __init__(self, probe: QueueProbe) -> None:
        self.adds = 0
        self.retries = 0
        self.latency_counts = [0] * _HIST_SIZE
        self.latency_sum = 0.0
        self.work_counts = [0] * _HIST_SIZE
        self.work_sum = 0.0
        self.probe: weakref.ref[QueueProbe] = weakref.ref(probe)

    def added(self) -> None:
        self.adds += 1

    def retried(self) -> None:
        self.retries += 1

    def observe_queue_latency(self, seconds: float) -> None:
        self.latency_counts[bisect_left(WORKQUEUE_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def observe_work_duration(self, seconds: float) -> None:
        self.work_counts[bisect_left(WORKQUEUE_BUCKETS, seconds)] += 1
        self.work_sum += seconds


def _cumulative_buckets(counts: Sequence[int], bounds: Sequence[float]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(bounds, counts, strict=False):
        running += count
        out.append((_go_float(bound), float(running)))
    out.append(("+Inf", float(running + counts[-1])))
    return out


class PrometheusWorkqueueMetrics:
    """Exports controller-runtime's ``workqueue_*`` series into ``registry``.

    Queues sharing a name share one series (counters continue across a re-created queue); depth and
    in-flight ages come from the queue most recently registered under that name.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._series: dict[str, _QueueSeries] = {}
        (registry if registry is not None else REGISTRY).register(self)

    def queue_metrics(self, name: str, probe: QueueProbe) -> QueueMetrics:
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = _QueueSeries(probe)
        else:
            series.probe = weakref.ref(probe)
        return series

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        CounterMetricFamily,
        HistogramMetricFamily,
        HistogramMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
    ]:
        labels = ["name", "controller"]
        return (
            GaugeMetricFamily("workqueue_depth", "Current depth of workqueue", labels=labels),
            CounterMetricFamily("workqueue_adds", "Total number of adds handled by workqueue", labels=labels),
            HistogramMetricFamily(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
                labels=labels,
            ),
            HistogramMetricFamily(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed "
                "by work_duration. Large values indicate stuck threads. One can deduce the number of "
                "stuck threads by observing the rate at which this increases.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                labels=labels,
            ),
            CounterMetricFamily(
                "workqueue_retries", "Total number of retries handled by workqueue", labels=labels
            ),
        )

    def describe(self) -> Iterable[Metric]:
        # Lets the registry check names without sampling any queue.
        return self._families()

    def collect(self) -> Iterable[Metric]:
        depth, adds, latency, work, unfinished, longest, retries = self._families()
        for name, series in list(self._series.items()):
            labels = [name, name]
            probe = series.probe()
            ages = probe.processing_ages() if probe is not None else []
            depth.add_metric(labels, float(len(probe)) if probe is not None else 0.0)
            adds.add_metric(labels, float(series.adds))
            retries.add_metric(labels, float(series.retries))
            latency.add_metric(
                labels,
                _cumulative_buckets(list(series.latency_counts), WORKQUEUE_BUCKETS),
                series.latency_sum,
            )
            work.add_metric(
                labels, _cumulative_buckets(list(series.work_counts), WORKQUEUE_BUCKETS), series.work_sum
            )
            unfinished.add_metric(labels, sum(ages))
            longest.add_metric(labels, max(ages, default=0.0))
        return (depth, adds, latency, work, unfinished, longest, retries)


# --- controller --------------------------------------------------------------------------------


class ReconcileOutcome(enum.Enum):
    """How one reconcile ended; ``label`` is controller-runtime's ``result`` label value."""

    SUCCESS = "success"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeue_after"
    ERROR = "error"
    TERMINAL_ERROR = "terminal_error"

    @property
    def label(self) -> str:
        return "error" if self is ReconcileOutcome.TERMINAL_ERROR else self.value


_RESULT_LABELS = ("success", "error", "requeue", "requeue_after")


class ControllerMetrics(Protocol):
    """Per-controller event sink."""

    def set_max_concurrent_reconciles(self, workers: int) -> None: ...

    def reconcile_started(self) -> None:
        """A worker took an item (one more active worker)."""
        ...

    def reconcile_finished(self, outcome: ReconcileOutcome | None, seconds: float) -> None:
        """A worker is free again; ``outcome`` is None when the reconcile was cancelled (not counted)."""
        ...


class ControllerMetricsProvider(Protocol):
    def controller_metrics(self, name: str) -> ControllerMetrics: ...


class NoopControllerMetrics:
    """Records nothing: the default when no provider is given."""

    def controller_metrics(self, name: str) -> ControllerMetrics:
        return self

    def set_max_concurrent_reconciles(self, workers: int) -> None:
        return None

    def reconcile_started(self) -> None:
        return None

    def reconcile_finished(self, outcome: ReconcileOutcome | None, seconds: float) -> None:
        return None


class _ControllerSeries:
    """One controller's label children, bound once."""

    __slots__ = ("_active", "_errors", "_max", "_terminal", "_time", "_totals")

    def __init__(self, owner: PrometheusControllerMetrics, name: str) -> None:
        # Every result label exists from the start (0), as controller-runtime does, so rate()
        # and absent() behave before the first error.
        self._totals = {label: owner.total.labels(name, label) for label in _RESULT_LABELS}
        self._errors = owner.errors.labels(name)
        self._terminal = owner.terminal_errors.labels(name)
        self._time = owner.time.labels(name)
        self._max = owner.max_concurrent.labels(name)
        self._active = owner.active_workers.labels(name)

    def set_max_concurrent_reconciles(self, workers: int) -> None:
        self._max.set(workers)

    def reconcile_started(self) -> None:
        self._active.inc()

    def reconcile_finished(self, outcome: ReconcileOutcome | None, seconds: float) -> None:
        self._active.dec()
        if outcome is None:
            return
        self._time.observe(seconds)
        self._totals[outcome.label].inc()
        if outcome is ReconcileOutcome.ERROR or outcome is ReconcileOutcome.TERMINAL_ERROR:
            self._errors.inc()
            if outcome is ReconcileOutcome.TERMINAL_ERROR:
                self._terminal.inc()


class PrometheusControllerMetrics:
    """Exports controller-runtime's ``controller_runtime_*`` series into ``registry``.

    Reconciles are milliseconds to minutes, so ordinary ``prometheus_client`` metrics are cheap here.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=reg,
        )
        self.errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=reg,
        )
        self.terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
            registry=reg,
        )
        self.time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_TIME_BUCKETS,
            registry=reg,
        )
        self.max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=reg,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=reg,
        )

    def controller_metrics(self, name: str) -> ControllerMetrics:
        return _ControllerSeries(self, name)
