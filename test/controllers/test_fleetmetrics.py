"""pko.controllers.fleetmetrics without a cluster: what a completed Update counts as, what a Stack's
status contributes, and that only the leader counts completions, each once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from pko.controllers.fleetmetrics import FleetMetrics, last_success, stack_conditions, update_outcome
from pko.machinery.store import DeletedFinalStateUnknown

Obj = dict[str, Any]


def update(type_: str = "up", *, complete: bool = True, failed: str | None = None, end: str = "") -> Obj:
    conditions = [{"type": "Complete", "status": "True" if complete else "False", "reason": "Updated"}]
    if complete:
        conditions.append(
            {"type": "Failed", "status": "True" if failed else "False", "reason": failed or "UpdateSucceeded"}
        )
    status = {"conditions": conditions, "startTime": "2026-12-06T10:00:00Z"}
    if end:
        status["endTime"] = end
    return {"metadata": {"name": "u", "namespace": "ns"}, "spec": {"type": type_}, "status": status}


def stack(
    name: str, *, ready: tuple[str, str] = ("True", "ProcessingCompleted"), last: Obj | None = None
) -> Obj:
    conditions = [{"type": "Ready", "status": ready[0], "reason": ready[1]}]
    if ready[0] != "True":
        conditions.append({"type": "Reconciling", "status": "True", "reason": "RetryingAfterFailure"})
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "status": {"conditions": conditions, "lastUpdate": last},
    }


def metrics(leading: bool = True) -> tuple[FleetMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    manager = SimpleNamespace(registry=registry, is_leader=lambda: leading)
    return FleetMetrics(manager), registry  # type: ignore[arg-type]


def test_an_update_counts_once_complete_with_its_type_result_and_duration() -> None:
    assert update_outcome(update(complete=False)) is None
    assert update_outcome(update(end="2026-12-06T10:01:30Z")) == ("up", "succeeded", 90.0)
    assert update_outcome(update("destroy", failed="UpdateFailed")) == ("destroy", "failed", None)
    assert update_outcome(update("up", failed="Canceled", end="2026-12-06T10:00:05Z")) == (
        "up",
        "canceled",
        5.0,
    )
    # An end before the start (clock skew between writers) has no duration, but still counts.
    assert update_outcome(update(end="2026-12-06T09:59:00Z")) == ("up", "succeeded", None)


def test_the_leader_counts_each_completion_once_and_a_standby_none() -> None:
    m, registry = metrics()
    running, done = update(complete=False), update(end="2026-12-06T10:00:12Z")
    m.update_changed(running, done)
    m.update_changed(done, done)  # a later change to a completed Update (a resync, a label) is not another
    labels = {"type": "up", "result": "succeeded"}
    assert registry.get_sample_value("pko_updates_total", labels) == 1
    assert registry.get_sample_value("pko_update_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("pko_update_duration_seconds_sum", labels) == 12
    assert registry.get_sample_value("pko_update_duration_seconds_bucket", {**labels, "le": "10.0"}) == 0
    assert registry.get_sample_value("pko_update_duration_seconds_bucket", {**labels, "le": "20.0"}) == 1

    standby, standby_registry = metrics(leading=False)
    standby.update_changed(running, done)
    assert standby_registry.get_sample_value("pko_updates_total", labels) is None


def test_each_policy_violation_of_a_completed_update_is_counted_by_pack_policy_and_level() -> None:
    m, registry = metrics()
    running, done = update(complete=False), update(failed="PolicyViolation")
    done["status"]["policyViolations"] = [
        {"policyPack": "guard", "policy": "no-public", "enforcementLevel": "mandatory", "message": "m"},
        {"policyPack": "guard", "policy": "labels", "enforcementLevel": "advisory", "message": "m"},
        {"policyPack": "guard", "policy": "labels", "enforcementLevel": "advisory", "message": "m2"},
    ]
    m.update_changed(running, done)
    m.update_changed(done, done)
    sample = registry.get_sample_value
    labels = {"pack": "guard", "policy": "no-public", "enforcement": "mandatory"}
    assert sample("pko_policy_violations_total", labels) == 1
    assert (
        sample("pko_policy_violations_total", {**labels, "policy": "labels", "enforcement": "advisory"}) == 2
    )


def test_stacks_are_counted_by_condition_status_and_reason_and_forgotten_when_deleted() -> None:
    m, registry = metrics()
    m.stack_seen(stack("a"))
    m.stack_seen(stack("b"))
    m.stack_seen(stack("c", ready=("False", "RetryingAfterFailure")))
    ready = {"condition": "Ready", "status": "True", "reason": "ProcessingCompleted"}
    assert registry.get_sample_value("pko_stacks", ready) == 2
    retrying = {"condition": "Reconciling", "status": "True", "reason": "RetryingAfterFailure"}
    assert registry.get_sample_value("pko_stacks", retrying) == 1
    m.stack_seen(stack("c"))  # c recovered: its earlier reasons no longer count
    assert registry.get_sample_value("pko_stacks", ready) == 3
    assert registry.get_sample_value("pko_stacks", retrying) is None
    m.stack_gone(stack("a"))
    m.stack_gone(DeletedFinalStateUnknown("ns/b", stack("b")))
    assert registry.get_sample_value("pko_stacks", ready) == 1
    assert stack_conditions({"status": {}}) == ()


def test_the_last_success_is_kept_through_a_failure_and_removed_with_the_stack() -> None:
    m, registry = metrics()
    ok = {"state": "succeeded", "lastResyncTime": "2026-12-06T10:00:00Z"}
    assert last_success(stack("a", last=ok)) == 1796551200.0
    m.stack_seen(stack("a", last=ok))
    labels = {"namespace": "ns", "name": "a"}
    assert (
        registry.get_sample_value("pko_stack_last_successful_update_timestamp_seconds", labels)
        == 1796551200.0
    )
    failed = {"state": "failed", "lastResyncTime": "2026-12-06T11:00:00Z"}
    assert last_success(stack("a", last=failed)) is None
    m.stack_seen(stack("a", last=failed))
    assert (
        registry.get_sample_value("pko_stack_last_successful_update_timestamp_seconds", labels)
        == 1796551200.0
    )
    m.stack_gone(stack("a"))
    assert registry.get_sample_value("pko_stack_last_successful_update_timestamp_seconds", labels) is None
