"""Drift detection and the request annotations (issue 29) as pure functions: when a check is due,
what it records (firstSeen kept, Events only on a change), remediation, the metrics, and the
Stack's ``decide`` for drift checks, refresh requests and cancel requests (no cluster; the real
engine runs them in test_real_engine_approval.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pko.api.stack import DriftDetectionSpec
from prometheus_client import CollectorRegistry

from pko.controllers.resources import CANCEL_REQUEST_ANNOTATION, REFRESH_REQUEST_ANNOTATION
from pko.controllers.stack.drift import drift_due_in, record_drift, record_drift_failure, remediation_due
from pko.controllers.stack.plan import CancelUpdate, CreateUpdate, Emit, Log, Observed, decide
from pko.controllers.stack.retry import retry_delay
from pko.controllers.stack.watches import STACK_PREDICATE, StackMetrics
from pko.machinery.conditions import format_time
from pko.machinery.controller import Result
from pko.machinery.store import clone

from .test_stack_plan import (
    DONE_UP,
    NOW,
    SETTINGS,
    SOURCE,
    condition,
    kinds,
    observed,
    parsed,
    stack,
    statuses,
    update,
    workspace,
)

Obj = dict[str, Any]
CM = "urn:pulumi:dev::p::kubernetes:core/v1:ConfigMap::cm"
DEP = "urn:pulumi:dev::p::kubernetes:apps/v1:Deployment::d"
EVERY_MINUTE = DriftDetectionSpec.model_validate({"intervalSeconds": 60})
REMEDIATE = DriftDetectionSpec.model_validate({"intervalSeconds": 60, "remediate": True})
WATCHED = {"driftDetection": {"intervalSeconds": 60}}


FOUND = {
    "urn": CM,
    "type": "kubernetes:core/v1:ConfigMap",
    "paths": ["data.a"],
    "firstSeen": "2026-11-27T04:00:00Z",
}


def check(changes: list[Obj], *, failed: bool = False) -> Obj:
    done = update("s-d", type_="refresh", changes=changes)
    done["spec"]["previewOnly"] = True
    if failed:
        done["status"]["conditions"][1] = {"type": "Failed", "status": "True", "reason": "UpdateFailed"}
        done["status"]["message"] = "error: the cluster is unreachable\nconnection refused"
    return done


def at(seconds: float) -> str:
    return format_time(NOW + timedelta(seconds=seconds))


# --- when a check is due -----------------------------------------------------------------------


def test_a_check_is_due_at_once_then_every_interval_and_never_before_a_deploy() -> None:
    assert drift_due_in(None, {"lastUpdate": DONE_UP}, NOW) is None
    assert drift_due_in(EVERY_MINUTE, {}, NOW) is None  # nothing deployed: nothing can drift
    assert drift_due_in(EVERY_MINUTE, {"lastUpdate": DONE_UP}, NOW) == 0
    checked = {"lastUpdate": DONE_UP, "drift": {"lastCheckTime": at(-20), "detected": False}}
    assert drift_due_in(EVERY_MINUTE, checked, NOW) == 40
    overdue = {"lastUpdate": DONE_UP, "drift": {"lastCheckTime": at(-600), "detected": False}}
    assert drift_due_in(EVERY_MINUTE, overdue, NOW) == 0


def test_after_an_up_that_followed_found_drift_the_next_check_is_due_at_once() -> None:
    up_after = {**DONE_UP, "lastResyncTime": at(-5)}
    found = {"lastUpdate": up_after, "drift": {"lastCheckTime": at(-10), "detected": True}}
    assert drift_due_in(EVERY_MINUTE, found, NOW) == 0
    assert remediation_due(REMEDIATE, found) is False  # the up ran since: check, do not up again
    before = {**found, "lastUpdate": {**DONE_UP, "lastResyncTime": at(-30)}}
    assert drift_due_in(EVERY_MINUTE, before, NOW) == 50
    assert remediation_due(REMEDIATE, before) is True
    assert remediation_due(EVERY_MINUTE, before) is False  # remediate is off


# --- what a check records ----------------------------------------------------------------------


def test_a_check_records_each_drifted_resource_with_its_paths_and_the_condition() -> None:
    status: Obj = {}
    changes = [
        {"urn": DEP, "type": "kubernetes:apps/v1:Deployment", "op": "delete"},
        {"urn": CM, "type": "kubernetes:core/v1:ConfigMap", "op": "update", "paths": ["data.greeting"]},
    ]
    result = record_drift(status, check(changes), 1, NOW)
    assert status["drift"] == {
        "lastCheckTime": at(0),
        "detected": True,
        "resources": [
            {"urn": DEP, "type": "kubernetes:apps/v1:Deployment", "firstSeen": at(0)},
            {
                "urn": CM,
                "type": "kubernetes:core/v1:ConfigMap",
                "firstSeen": at(0),
                "paths": ["data.greeting"],
            },
        ],
        "count": 2,
    }
    drifted = condition(status, "Drifted")
    assert drifted is not None and drifted[:2] == ("True", "DriftDetected")
    assert f"{CM} (data.greeting)" in drifted[2] and f"{DEP} (gone)" in drifted[2]
    assert [e.reason for e in result.events] == ["DriftDetected"]


def test_first_seen_is_kept_across_checks_and_events_mark_only_a_change() -> None:
    status: Obj = {}
    change = {"urn": CM, "type": "kubernetes:core/v1:ConfigMap", "op": "update", "paths": ["data.a"]}
    record_drift(status, check([change]), 1, NOW - timedelta(minutes=5))
    later = record_drift(status, check([{**change, "paths": ["data.b"]}]), 1, NOW)
    [resource] = status["drift"]["resources"]
    assert resource["firstSeen"] == format_time(NOW - timedelta(minutes=5)) and resource["paths"] == [
        "data.b"
    ]
    assert later.events == []  # still drifted: no new Event
    cleared = record_drift(status, check([]), 1, NOW)
    assert status["drift"] == {"lastCheckTime": at(0), "detected": False}
    assert [e.reason for e in cleared.events] == ["DriftCleared"]
    assert condition(status, "Drifted") == ("False", "NoDrift", "no resource differs from the stack's state")
    again = record_drift(status, check([change]), 1, NOW + timedelta(minutes=1))
    assert status["drift"]["resources"][0]["firstSeen"] == at(60)  # a new drift, a new firstSeen
    assert [e.reason for e in again.events] == ["DriftDetected"]


def test_a_failed_check_keeps_what_was_found_and_says_why() -> None:
    status: Obj = {"drift": {"lastCheckTime": at(-60), "detected": True, "resources": [{"urn": CM}]}}
    emit = record_drift_failure(status, check([], failed=True), NOW)
    assert emit.reason == "DriftCheckFailed" and "connection refused" in emit.message
    assert status["drift"]["detected"] is True and status["drift"]["resources"] == [{"urn": CM}]
    assert status["drift"]["lastCheckTime"] == at(0) and status["drift"]["message"] == "connection refused"


# --- metrics -----------------------------------------------------------------------------------


class _Manager:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()


def test_the_drift_gauges_follow_the_last_check_and_go_with_the_stack() -> None:
    manager = _Manager()
    metrics = StackMetrics(manager)  # type: ignore[arg-type]
    labels = {"namespace": "ns", "name": "s"}
    obj = stack(WATCHED, {"lastUpdate": DONE_UP})
    metrics.observe(obj)
    assert manager.registry.get_sample_value("pko_stack_drift_resources", labels) is None
    obj["status"]["drift"] = {
        "lastCheckTime": at(0),
        "detected": True,
        "resources": [{"urn": CM}, {"urn": DEP}],
    }
    metrics.observe(obj)
    assert manager.registry.get_sample_value("pko_stack_drift_resources", labels) == 2
    obj["status"]["drift"]["count"] = 3000  # resources lists the first 250 of them
    metrics.observe(obj)
    assert manager.registry.get_sample_value("pko_stack_drift_resources", labels) == 3000
    stamp = manager.registry.get_sample_value("pko_stack_last_drift_check_timestamp_seconds", labels)
    assert stamp == NOW.timestamp()
    metrics.forget(obj)
    assert manager.registry.get_sample_value("pko_stack_drift_resources", labels) is None
    assert manager.registry.get_sample_value("pko_stack_last_drift_check_timestamp_seconds", labels) is None


def test_the_failure_gauges_follow_each_change_of_the_stack() -> None:
    """An event that changes nothing the gauges export sets nothing; each change still shows, a
    retry time cleared goes, and a Stack seen again after it was forgotten is set afresh."""
    manager = _Manager()
    metrics = StackMetrics(manager)  # type: ignore[arg-type]
    labels = {"namespace": "ns", "name": "s"}
    sample = manager.registry.get_sample_value
    in_60 = (NOW + timedelta(seconds=60)).timestamp()
    failed = {**DONE_UP, "state": "failed"}
    obj = stack(WATCHED, {"lastUpdate": failed, "nextRetryTime": at(60)})
    for _ in range(2):  # the second, unchanged: the same values
        metrics.observe(obj)
        assert sample("stacks_failing", labels) == 1 and sample("stacks_active") == 1
        assert sample("stacks_next_retry_timestamp_seconds", labels) == in_60
    obj["status"]["nextRetryTime"] = at(120)
    metrics.observe(obj)
    assert sample("stacks_next_retry_timestamp_seconds", labels) == in_60 + 60
    obj["status"]["conditions"] = [{"type": "Reconciling", "status": "True", "reason": "r", "message": ""}]
    metrics.observe(obj)
    assert sample("stacks_reconciling", labels) == 1
    obj["status"]["lastUpdate"] = {**DONE_UP, "state": "running"}  # neither: failing left as it is
    metrics.observe(obj)
    assert sample("stacks_failing", labels) == 1
    assert sample("stacks_next_retry_timestamp_seconds", labels) is None
    obj["status"] = {"lastUpdate": DONE_UP}
    metrics.observe(obj)
    assert sample("stacks_failing", labels) == 0 and sample("stacks_reconciling", labels) == 0
    metrics.forget(obj)
    assert sample("stacks_active") == 0
    obj["status"] = {"lastUpdate": failed, "nextRetryTime": at(60)}
    metrics.observe(obj)
    assert sample("stacks_failing", labels) == 1 and sample("stacks_active") == 1
    assert sample("stacks_next_retry_timestamp_seconds", labels) == in_60


def test_an_event_that_changes_nothing_the_gauges_show_sets_nothing() -> None:
    """A Stack's first pass brings four looks at one status (its first event, its finalizer's and its
    status's, the status write's answer): the gauges are set from the first only."""
    manager = _Manager()
    metrics = StackMetrics(manager)  # type: ignore[arg-type]
    obj = stack(WATCHED, {"lastUpdate": {**DONE_UP, "state": "failed"}, "nextRetryTime": at(60)})
    metrics.observe(obj)
    for gauge in (metrics.failing, metrics.reconciling, metrics.next_retry):
        gauge.labels("ns", "s").set(-1)  # a value observe would never set: it shows whether it set again
    metrics.observe(clone(obj) | {"metadata": {**obj["metadata"], "resourceVersion": "2"}})
    sample = manager.registry.get_sample_value
    labels = {"namespace": "ns", "name": "s"}
    assert sample("stacks_failing", labels) == sample("stacks_reconciling", labels) == -1
    assert sample("stacks_next_retry_timestamp_seconds", labels) == -1
    obj["status"]["conditions"] = [{"type": "Reconciling", "status": "True", "reason": "r", "message": ""}]
    metrics.observe(obj)  # only what changed is set
    assert sample("stacks_reconciling", labels) == 1 and sample("stacks_failing", labels) == -1


def test_the_request_annotations_wake_the_stack() -> None:
    for name in ("pulumi.com/approved-plan", REFRESH_REQUEST_ANNOTATION, CANCEL_REQUEST_ANNOTATION):
        old = stack()
        new = stack(annotations={name: "t1"})
        assert STACK_PREDICATE(old, new), name
    assert not STACK_PREDICATE(stack(), stack(annotations={"unrelated": "x"}))


# --- decide: drift checks ----------------------------------------------------------------------


def created(plan_: Any) -> Obj:
    assert plan_.then is not None, kinds(plan_)
    rest = plan_.then(workspace())
    [create] = [w for w in rest.writes if isinstance(w, CreateUpdate)]
    body: Obj = create.body
    return body


def test_a_deployed_stack_runs_a_read_only_check_without_marking_itself_reconciling() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "ProcessingCompleted", "message": "m",
             "lastTransitionTime": at(-100)}  # fmt: skip
    obj = stack(WATCHED, {"lastUpdate": DONE_UP, "conditions": [ready]})
    plan_ = decide(observed(obj, source=SOURCE))
    assert condition(statuses(plan_)[0], "Reconciling") is None
    assert plan_.then is not None
    rest = plan_.then(workspace())
    assert not any(isinstance(w, Emit) for w in rest.writes)  # no StackUpdateDetected every minute
    assert any(isinstance(w, Log) and w.event == "drift check started" for w in rest.writes)
    body = created(plan_)
    assert body["spec"]["type"] == "refresh" and body["spec"]["previewOnly"] is True
    status = statuses(rest)[0]
    assert status["currentUpdate"]["kind"] == "drift"
    assert condition(status, "Ready") == (
        "True",
        "ProcessingCompleted",
        "the stack has been processed and is up to date",
    )

    # While it runs, the conditions stay; when it ends, the result is recorded, the next is scheduled.
    running = check([])
    running["status"]["conditions"] = [{"type": "Progressing", "status": "True", "reason": "Progressing"}]
    during = decide(observed(obj | {"status": status}, current_update=running))
    assert condition(statuses(during)[0], "Reconciling") is None
    ended = decide(observed(obj | {"status": status}, current_update=check([]), source=SOURCE))
    final = statuses(ended)[-1]
    assert final["drift"] == {"lastCheckTime": at(0), "detected": False}
    assert final["lastUpdate"] == DONE_UP  # a check is not a sync
    assert ended.result == Result.requeue_after(60)


def test_found_drift_with_remediate_runs_an_up_that_refreshes_first() -> None:
    drift = {"lastCheckTime": at(-1), "detected": True, "resources": [FOUND]}
    spec = {"driftDetection": {"intervalSeconds": 60, "remediate": True}}
    status = {"lastUpdate": {**DONE_UP, "lastResyncTime": at(-30)}, "drift": drift}
    plan_ = decide(observed(stack(spec, status), source=SOURCE))
    body = created(plan_)
    assert body["spec"]["type"] == "up" and body["spec"]["refresh"] is True
    assert body["spec"]["message"] == "Drift detected: remediating"
    # Without remediate the drift is only reported: the next check waits for its interval.
    reported = decide(observed(stack(WATCHED, {"lastUpdate": {**DONE_UP, "lastResyncTime": at(-30)},
                                               "drift": drift}), source=SOURCE))  # fmt: skip
    assert reported.then is None and reported.result == Result.requeue_after(59)


def test_remediation_goes_through_the_approval_gate() -> None:
    drift = {"lastCheckTime": at(-1), "detected": True, "resources": [FOUND]}
    spec = {"driftDetection": {"intervalSeconds": 60, "remediate": True}, "approval": {"mode": "Always"}}
    body = created(decide(observed(stack(spec, {"lastUpdate": {**DONE_UP, "lastResyncTime": at(-30)},
                                                "drift": drift}), source=SOURCE)))  # fmt: skip
    assert body["spec"]["type"] == "preview" and body["spec"]["savePlan"] is True and body["spec"]["refresh"]


def test_turning_drift_detection_off_forgets_what_it_found() -> None:
    drifted = {"type": "Drifted", "status": "True", "reason": "DriftDetected", "message": "m",
               "lastTransitionTime": at(-100)}  # fmt: skip
    status = {
        "lastUpdate": DONE_UP,
        "drift": {"lastCheckTime": at(-1), "detected": True},
        "conditions": [drifted],
    }
    plan_ = decide(observed(stack({}, status), source=SOURCE))
    final = statuses(plan_)[-1]
    assert "drift" not in final and condition(final, "Drifted") is None


# --- decide: refresh and cancel requests ------------------------------------------------------


def test_a_new_refresh_request_runs_one_refresh_recorded_when_it_ends() -> None:
    obj = stack({}, {"lastUpdate": DONE_UP}, annotations={REFRESH_REQUEST_ANNOTATION: "r1"})
    plan_ = decide(observed(obj, source=SOURCE))
    body = created(plan_)
    assert body["spec"]["type"] == "refresh" and not body["spec"].get("previewOnly")
    assert body["metadata"]["annotations"][REFRESH_REQUEST_ANNOTATION] == "r1"
    status = statuses(plan_.then(workspace()))[0]  # type: ignore[misc]
    assert "observedRefreshRequest" not in status and status["currentUpdate"]["kind"] == "refresh"
    done = update(body["metadata"]["name"], type_="refresh", resourceChanges={"same": 2})
    done["spec"], done["metadata"]["annotations"] = body["spec"], body["metadata"]["annotations"]
    ended = decide(observed(stack({}, status, annotations={REFRESH_REQUEST_ANNOTATION: "r1"}),
                            current_update=done, source=SOURCE))  # fmt: skip
    final = statuses(ended)[-1]
    assert final["observedRefreshRequest"] == "r1" and final["lastUpdate"] == DONE_UP
    assert [w.reason for w in ended.writes if isinstance(w, Emit)] == ["StackRefreshed"]
    assert ended.then is None  # the same token runs nothing more


AGENT_STOPPED = "the agent stopped before the operation finished"


def refreshing(name: str, before: Obj | None = None) -> Obj:
    """The Stack's status while the refresh Update ``name`` runs (``before``: what it held)."""
    current = {"name": name, "generation": 1, "commit": "sha256:1", "kind": "refresh"}
    return {**(before or {"lastUpdate": DONE_UP}), "currentUpdate": current}


def refresh_ended(name: str, token: str, *, failed: str | None = None, message: str = "") -> Obj:
    ended = update(name, type_="refresh", failed=failed, message=message)
    ended["metadata"]["annotations"] = {REFRESH_REQUEST_ANNOTATION: token}
    return ended


def at_time(obj: Obj, seconds: float, **fields: Any) -> Observed:
    """What a reconcile ``seconds`` after NOW reads."""
    when = NOW + timedelta(seconds=seconds)
    return Observed(obj, now=when, created=when, settings=SETTINGS, source=SOURCE, **fields)


def requested(status: Obj, token: str = "r1", spec: Obj | None = None) -> Obj:
    return stack(spec or {}, status, annotations={REFRESH_REQUEST_ANNOTATION: token})


def test_a_refresh_that_failed_transiently_keeps_its_request_and_runs_again_after_the_backoff() -> None:
    """The agent killed mid-refresh: the token is not observed, the Stack says it retries, nothing
    refreshes before the Stack's transient backoff whatever wakes it, then the refresh runs again."""
    failed = refresh_ended("s-r1", "r1", failed="AgentRestarted", message=AGENT_STOPPED)
    ended = decide(at_time(requested(refreshing("s-r1")), 0, current_update=failed))
    final = statuses(ended)[-1]
    assert "observedRefreshRequest" not in final and "currentUpdate" not in final
    assert final["lastRefresh"] == {
        "name": "s-r1",
        "token": "r1",
        "state": "failed",
        "message": AGENT_STOPPED,
        "reason": "Transient",
        "failures": 1,
        "lastResyncTime": at(0),
    }
    assert final["lastUpdate"] == DONE_UP and "lastFailure" not in final  # the up's record is untouched
    [event] = [w for w in ended.writes if isinstance(w, Emit)]
    assert (event.type, event.reason) == ("Warning", "StackRefreshFailed") and "transient" in event.message
    delay = retry_delay(
        transient=True, failures=0, spec=parsed(stack()).spec, settings=SETTINGS.retry, seed="s-r1"
    )
    assert ended.then is None and ended.result == Result.requeue_after(delay)
    assert condition(final, "Ready") == ("False", "NotReadyInProgress", "reconciliation is in progress")
    reconciling = condition(final, "Reconciling")
    assert reconciling is not None and reconciling[:2] == ("True", "RetryingAfterFailure")
    assert (
        'refresh request "r1" failed 1 time(s)' in reconciling[2]
        and f"retrying at {at(delay)}" in reconciling[2]
    )
    assert condition(final, "Stalled") is None

    # Woken before the wait is over (any event): no refresh starts, the wait goes on, nothing changes.
    early = decide(at_time(requested(final), 1))
    assert early.then is None and early.result == Result.requeue_after(delay - 1)
    assert statuses(early)[-1]["conditions"] == final["conditions"]

    # Once it is over, the refresh runs again, for the same token.
    body = created(decide(at_time(requested(final), delay)))
    assert (
        body["spec"]["type"] == "refresh"
        and body["metadata"]["annotations"][REFRESH_REQUEST_ANNOTATION] == "r1"
    )

    # A second transient failure waits longer; a success then records the token and resets the count.
    again = decide(at_time(requested(refreshing("s-r2", final)), delay + 10, current_update=refresh_ended(
        "s-r2", "r1", failed="UpdateConflict", message="another update is in progress")))  # fmt: skip
    second = statuses(again)[-1]
    assert second["lastRefresh"]["failures"] == 2 and "observedRefreshRequest" not in second
    longer = retry_delay(
        transient=True, failures=1, spec=parsed(stack()).spec, settings=SETTINGS.retry, seed="s-r2"
    )
    assert again.result == Result.requeue_after(longer) and longer > delay
    done = decide(at_time(requested(refreshing("s-r3", second)), delay + 10 + longer,
                          current_update=refresh_ended("s-r3", "r1")))  # fmt: skip
    last = statuses(done)[-1]
    assert last["observedRefreshRequest"] == "r1" and done.then is None
    ended_at = at(delay + 10 + longer)
    assert last["lastRefresh"] == {
        "name": "s-r3", "token": "r1", "state": "succeeded", "failures": 0, "lastResyncTime": ended_at,
    }  # fmt: skip
    assert condition(last, "Ready") is not None and condition(last, "Ready")[0] == "True"  # type: ignore[index]
    assert condition(last, "Reconciling") is None


def test_a_refresh_that_failed_for_good_records_its_request_and_warns() -> None:
    """A program error is not retried for a one-off request: only the user can fix it."""
    failed = refresh_ended("s-r1", "r1", failed="ProgramError", message="error: boom\n  at index.ts:3")
    ended = decide(at_time(requested(refreshing("s-r1")), 0, current_update=failed))
    final = statuses(ended)[-1]
    assert final["observedRefreshRequest"] == "r1"
    assert final["lastRefresh"]["state"] == "failed" and final["lastRefresh"]["reason"] == "ProgramError"
    assert (
        final["lastRefresh"]["message"] == "error: boom\n  at index.ts:3"
        and final["lastRefresh"]["failures"] == 1
    )
    assert [(w.type, w.reason) for w in ended.writes if isinstance(w, Emit)] == [
        ("Warning", "StackRefreshFailed")
    ]
    assert ended.then is None and ended.result == Result.done()
    assert condition(final, "Ready") is not None and condition(final, "Ready")[0] == "True"  # type: ignore[index]


def test_a_new_refresh_request_runs_at_once_even_while_another_waits_for_its_retry() -> None:
    failed = refresh_ended("s-r1", "r1", failed="AgentRestarted", message=AGENT_STOPPED)
    waiting = statuses(decide(at_time(requested(refreshing("s-r1")), 0, current_update=failed)))[-1]
    body = created(decide(at_time(requested(waiting, "r2"), 1)))
    assert body["metadata"]["annotations"][REFRESH_REQUEST_ANNOTATION] == "r2"


def test_a_refresh_retry_follows_the_stacks_own_retry_policy_and_holds_off_drift_checks() -> None:
    policy = {"retryPolicy": {"transient": {"baseSeconds": 30, "factor": 1, "jitter": 0}}, **WATCHED}
    failed = refresh_ended("s-r1", "r1", failed="AgentRestarted", message=AGENT_STOPPED)
    checked = {"lastUpdate": DONE_UP, "drift": {"lastCheckTime": at(-600), "detected": False}}
    ended = decide(at_time(requested(refreshing("s-r1", checked), spec=policy), 0, current_update=failed))
    final = statuses(ended)[-1]
    assert ended.then is None and ended.result == Result.requeue_after(30.0)  # no drift check meanwhile
    assert decide(at_time(requested(final, spec=policy), 29)).then is None
    body = created(decide(at_time(requested(final, spec=policy), 30)))
    assert body["spec"]["type"] == "refresh" and not body["spec"].get("previewOnly")


def test_a_stack_waiting_for_a_prerequisite_still_retries_a_refresh_request_on_time() -> None:
    failed = {"name": "s-r1", "token": "r1", "state": "failed", "reason": "Transient", "failures": 1,
              "lastResyncTime": at(0)}  # fmt: skip
    obj = stack({"prerequisites": [{"name": "other"}]}, {"lastUpdate": DONE_UP, "lastRefresh": failed},
                annotations={REFRESH_REQUEST_ANNOTATION: "r1"}, generation=2)  # fmt: skip
    plan_ = decide(at_time(obj, 1, prerequisites={"other": None}))  # an up is due, and blocked
    delay = retry_delay(
        transient=True, failures=0, spec=parsed(obj).spec, settings=SETTINGS.retry, seed="s-r1"
    )
    assert plan_.then is None and plan_.result == Result.requeue_after(delay - 1)
    reconciling = condition(statuses(plan_)[-1], "Reconciling")
    assert reconciling is not None and reconciling[1] == "PrerequisiteNotSatisfied"


def test_a_refresh_cancelled_on_request_ends_its_request() -> None:
    status = refreshing("s-r1")
    status["currentUpdate"]["cancelRequest"] = "c1"
    cancelled = refresh_ended("s-r1", "r1", failed="Canceled", message="the Update was canceled")
    obj = stack({}, status, annotations={REFRESH_REQUEST_ANNOTATION: "r1", CANCEL_REQUEST_ANNOTATION: "c1"})
    final = statuses(decide(at_time(obj, 0, current_update=cancelled)))[-1]
    assert final["observedRefreshRequest"] == "r1"
    assert (
        final["lastRefresh"]["reason"] == "Cancelled"
        and final["lastRefresh"]["message"] == "cancelled on request 'c1'"
    )


def running_up() -> Obj:
    running = update("s-2")
    running["metadata"]["uid"] = "uid-2"
    running["status"]["conditions"] = [{"type": "Progressing", "status": "True", "reason": "Progressing"}]
    return running


def test_a_cancel_request_deletes_the_running_update_and_the_stack_holds_cancelled() -> None:
    current = {"name": "s-2", "generation": 1, "commit": "sha256:1"}
    obj = stack(
        {}, {"lastUpdate": DONE_UP, "currentUpdate": current}, annotations={CANCEL_REQUEST_ANNOTATION: "c1"}
    )
    plan_ = decide(observed(obj, current_update=running_up()))
    assert kinds(plan_) == ["WriteStatus", "Emit", "CancelUpdate"]
    assert plan_.writes[2] == CancelUpdate("s-2", "uid-2")
    status = statuses(plan_)[0]
    assert status["observedCancelRequest"] == "c1" and status["currentUpdate"]["cancelRequest"] == "c1"
    assert (
        condition(status, "Reconciling") is not None and condition(status, "Reconciling")[1] == "Cancelling"
    )  # type: ignore[index]

    # The Update ends Canceled: recorded as Cancelled, not retried, until the next change.
    ended = update("s-2", failed="Canceled", message="the Update was canceled")
    later = stack({}, status, annotations={CANCEL_REQUEST_ANNOTATION: "c1"})
    held = decide(observed(later, current_update=ended, source=SOURCE))
    final = statuses(held)[-1]
    assert final["lastFailure"]["reason"] == "Cancelled" and final["lastFailure"]["transient"] is False
    assert "nextRetryTime" not in final and held.then is None and held.result == Result.done()
    assert condition(final, "Ready") is not None and condition(final, "Ready")[:2] == ("False", "Cancelled")  # type: ignore[index]
    assert condition(final, "Stalled") is None
    # A new generation is the next change: it runs again.
    moved = stack({}, final, annotations={CANCEL_REQUEST_ANNOTATION: "c1"}, generation=2)
    assert created(decide(observed(moved, source=SOURCE)))["spec"]["type"] == "up"


def test_a_cancel_request_with_nothing_running_is_recorded_and_changes_nothing() -> None:
    obj = stack({}, {"lastUpdate": DONE_UP}, annotations={CANCEL_REQUEST_ANNOTATION: "c2"})
    plan_ = decide(observed(obj, source=SOURCE))
    assert not any(isinstance(w, CancelUpdate) for w in plan_.writes) and plan_.then is None
    assert [w.reason for w in plan_.writes if isinstance(w, Emit)] == ["NothingToCancel"]
    final = statuses(plan_)[-1]
    assert final["observedCancelRequest"] == "c2"
    assert condition(final, "Ready") is not None and condition(final, "Ready")[0] == "True"  # type: ignore[index]
