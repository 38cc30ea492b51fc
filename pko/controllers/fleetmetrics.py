"""The series alert rules and dashboards read (config/prometheus): how long updates take and how they
end, when each Stack last succeeded, and how many Stacks stand at each condition reason.

Kept from the Update and Stack informers' events, never from a reconcile: they cost no request and no
work on a reconcile's path, and they read only what the objects record, so any replica can keep them.

Counting is per completion seen, and only while this replica leads (the one that runs the Update
controller): every replica watches the same Updates, so standbys counting too would multiply the
fleet's ``sum(rate(...))``. An Update already complete when the operator starts (its cache's first
list) is not counted again: a restart would otherwise turn every kept Update into a burst of new
completions, which ``increase()`` reads as real. A relist after a lost watch reports what completed
meanwhile as updates, so those are counted.

The Stack-side series come from each Stack's own status, so they are right on every replica and
after a restart: ``pko_stacks`` counts Stacks by each condition's status and reason (bounded
labels: no Stack names; a scrape reads a snapshot of per-Stack tuples kept from events, never the
cache), and the last success is the ``lastResyncTime`` of a ``lastUpdate`` that succeeded (absent
until a Stack's first success is seen: a Stack whose last update failed before this process started
shows none).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from typing import Final

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from pko.api.update import CONDITION_COMPLETE, CONDITION_FAILED
from pko.controllers.resources import STACKS, UPDATES
from pko.machinery.conditions import get_condition, parse_time
from pko.machinery.informer import FuncHandler
from pko.machinery.manager import Manager
from pko.machinery.resource import Obj
from pko.machinery.store import DeletedFinalStateUnknown, object_key, split_key

__all__ = [
    "STACK_CONDITION_TYPES",
    "UPDATE_DURATION_BUCKETS",
    "FleetMetrics",
    "last_success",
    "policy_violations",
    "setup",
    "stack_conditions",
    "update_outcome",
]

# Seconds: a YAML program's up takes a few, a cloud database's many minutes.
UPDATE_DURATION_BUCKETS: Final[tuple[float, ...]] = (
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
)  # fmt: skip
# The Stack conditions counted in ``pko_stacks`` (the ones kstatus, Argo CD and users read).
STACK_CONDITION_TYPES: Final[tuple[str, ...]] = ("Ready", "Reconciling", "Stalled")
# The Failed reason of an Update that was cancelled (the Go operator's spelling).
_CANCELED: Final = "Canceled"

ConditionKey = tuple[str, str, str]  # (type, status, reason)


def update_outcome(update: Obj) -> tuple[str, str, float | None] | None:
    """``(type, result, seconds)`` of a completed Update (result: succeeded, failed or canceled;
    seconds from its start to its end, None when either is missing), or None while it has none."""
    conditions = (update.get("status") or {}).get("conditions")
    complete = get_condition(conditions, CONDITION_COMPLETE)
    if complete is None or complete.get("status") != "True":
        return None
    failed = get_condition(conditions, CONDITION_FAILED) or {}
    if failed.get("status") != "True":
        result = "succeeded"
    else:
        result = "canceled" if failed.get("reason") == _CANCELED else "failed"
    status = update.get("status") or {}
    start, end = parse_time(status.get("startTime")), parse_time(status.get("endTime"))
    seconds = (end - start).total_seconds() if start and end and end >= start else None
    return str((update.get("spec") or {}).get("type") or "unknown"), result, seconds


def policy_violations(update: Obj) -> list[tuple[str, str, str]]:
    """(pack, policy, enforcement level) of each violation a completed Update lists
    (``status.policyViolations``, bounded: a long list is counted as far as it is kept)."""
    listed = ((update.get("status") or {}).get("policyViolations")) or []
    return [
        (str(v.get("policyPack") or ""), str(v.get("policy") or ""), str(v.get("enforcementLevel") or ""))
        for v in listed
        if isinstance(v, dict)
    ]


def stack_conditions(stack: Obj) -> tuple[ConditionKey, ...]:
    """The Stack's counted conditions as ``(type, status, reason)``; a type not set is left out."""
    conditions = (stack.get("status") or {}).get("conditions")
    found = (get_condition(conditions, type_) for type_ in STACK_CONDITION_TYPES)
    return tuple(
        (str(c.get("type")), str(c.get("status")), str(c.get("reason") or "")) for c in found if c is not None
    )


def last_success(stack: Obj) -> float | None:
    """Unix seconds when the Stack's last update succeeded, if its ``lastUpdate`` is one that did."""
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    if last.get("state") != "succeeded":
        return None
    when = parse_time(last.get("lastResyncTime"))
    return when.timestamp() if when else None


def _key(obj: Obj | DeletedFinalStateUnknown) -> tuple[str, str]:
    if isinstance(obj, DeletedFinalStateUnknown):
        namespace, name = split_key(obj.key)
        return namespace or "", name
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name"))


class _StacksByCondition:
    """``pko_stacks``: a gauge family built at scrape time from per-Stack tuples kept from events."""

    def __init__(self) -> None:
        self.by_stack: dict[str, tuple[ConditionKey, ...]] = {}

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        # list() of the values is one C-level snapshot: the loop may add Stacks meanwhile.
        tally = Tally(key for keys in list(self.by_stack.values()) for key in keys)
        for (type_, status, reason), count in sorted(tally.items()):
            family.add_metric([type_, status, reason], count)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "pko_stacks",
            "Stacks by condition (Ready, Reconciling, Stalled), its status and its reason",
            labels=["condition", "status", "reason"],
        )


class FleetMetrics:
    """The series, and the informer handlers that keep them."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        registry = manager.registry
        self.durations = Histogram(
            "pko_update_duration_seconds",
            "Seconds from an Update's start to its end, by type (up, preview, refresh, destroy) and result "
            "(succeeded, failed, canceled); counted by the leader as each Update completes",
            ["type", "result"],
            buckets=UPDATE_DURATION_BUCKETS,
            registry=registry,
        )
        self.updates = Counter(
            "pko_updates",
            "Updates completed, by type and result (succeeded, failed, canceled); counted by the leader",
            ["type", "result"],
            registry=registry,
        )
        self.policy_violations = Counter(
            "pko_policy_violations",
            "Policy violations reported by completed Updates (spec.policyPacks), by pack, policy and "
            "enforcement level (mandatory, advisory, remediate); counted by the leader",
            ["pack", "policy", "enforcement"],
            registry=registry,
        )
        self.last_success = Gauge(
            "pko_stack_last_successful_update_timestamp_seconds",
            "When the stack's last successful update completed (unix seconds); absent until one is seen",
            ["namespace", "name"],
            registry=registry,
        )
        self.stacks = _StacksByCondition()
        registry.register(self.stacks)

    # -- Updates

    def update_changed(self, old: Obj, new: Obj) -> None:
        if update_outcome(old) is not None or not self.manager.is_leader():
            return
        outcome = update_outcome(new)
        if outcome is None:
            return
        type_, result, seconds = outcome
        self.updates.labels(type_, result).inc()
        if seconds is not None:
            self.durations.labels(type_, result).observe(seconds)
        for pack, policy, level in policy_violations(new):
            self.policy_violations.labels(pack, policy, level).inc()

    # -- Stacks

    def stack_seen(self, stack: Obj) -> None:
        namespace, name = _key(stack)
        self.stacks.by_stack[object_key(namespace, name)] = stack_conditions(stack)
        when = last_success(stack)
        if when is not None:
            self.last_success.labels(namespace, name).set(when)

    def stack_gone(self, stack: Obj | DeletedFinalStateUnknown) -> None:
        namespace, name = _key(stack)
        self.stacks.by_stack.pop(object_key(namespace, name), None)
        try:
            self.last_success.remove(namespace, name)
        except KeyError:
            pass


def setup(manager: Manager) -> FleetMetrics:
    """Register the series on ``manager`` and keep them from its Update and Stack informers."""
    metrics = FleetMetrics(manager)
    manager.informer(UPDATES).add_event_handler(FuncHandler(update=metrics.update_changed))
    manager.informer(STACKS).add_event_handler(
        FuncHandler(
            add=metrics.stack_seen,
            update=lambda _old, new: metrics.stack_seen(new),
            delete=metrics.stack_gone,
        )
    )
    return metrics
