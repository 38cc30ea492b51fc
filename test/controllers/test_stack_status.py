"""Stack status rules and the "what next" decision: upstream's reasons and messages, classified retries."""

from __future__ import annotations

import base64
import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pko.api.stack import StackSpec

from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.retry import (
    classify_failure,
    deterministic_delay,
    for_stack,
    jitter_fraction,
    retry_delay,
    tail_lines,
    transient_delay,
)
from pko.controllers.stack.status import (
    StackRef,
    destroyed_nothing,
    go_duration,
    mark_ready,
    mark_reconciling,
    mark_result,
    mark_stalled,
    mark_suspended,
    outputs_from_secret,
    plan_sync,
    record_destroyed_nothing,
    record_failed,
    record_lost,
    record_succeeded,
    requirement_error,
    resources_after,
)
from pko.machinery.conditions import format_time, get_condition

T0 = datetime(2024, 10, 17, 20, 0, 0, tzinfo=UTC)
SETTINGS = RetrySettings()


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", "programRef": {"name": "p"}, **fields})


def stack_obj(generation: int = 1, request: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "s", "namespace": "ns", "generation": generation}
    if request is not None:
        meta["annotations"] = {"pulumi.com/reconciliation-request": request}
    if deleting:
        meta["deletionTimestamp"] = format_time(T0)
    return {"metadata": meta}


def update(
    name: str, type_: str = "up", failed: str | None = None, message: str = "", **status: Any
) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True", "reason": "Updated"}]
    if failed is not None:
        conditions.append({"type": "Failed", "status": "True", "reason": failed})
    return {
        "metadata": {"name": name},
        "spec": {"type": type_},
        "status": {"message": message, "conditions": conditions, **status},
    }


def current(name: str, generation: int = 1, commit: str = "r1", request: str = "") -> dict[str, Any]:
    return {"name": name, "generation": generation, "commit": commit, "reconcileRequest": request}


def types(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


# --- conditions ------------------------------------------------------------------------------


def test_conditions_are_exclusive_as_upstream() -> None:
    status: dict[str, Any] = {}
    mark_reconciling(status, "StackProcessing", "waiting for workspace readiness", 1, T0)
    assert types(status) == {
        "Ready": ("False", "NotReadyInProgress", "reconciliation is in progress"),
        "Reconciling": ("True", "StackProcessing", "waiting for workspace readiness"),
    }
    mark_stalled(status, "SpecInvalid", "bad", 1, T0)
    assert types(status) == {
        "Ready": ("False", "NotReadyStalled", "reconciliation is stalled"),
        "Stalled": ("True", "SpecInvalid", "bad"),
    }
    mark_ready(status, 2, T0)
    assert types(status) == {
        "Ready": ("True", "ProcessingCompleted", "the stack has been processed and is up to date")
    }
    assert status["conditions"][0]["observedGeneration"] == 2


def test_suspended_condition_comes_and_goes_and_keeps_ready() -> None:
    status: dict[str, Any] = {}
    mark_ready(status, 1, T0)
    mark_suspended(status, True, 1, T0)
    assert types(status)["Ready"][0] == "True" and types(status)["Suspended"][0] == "True"
    mark_suspended(status, False, 1, T0)
    assert "Suspended" not in types(status)


def test_a_suspended_stack_has_no_retry_due() -> None:
    status = failed_status(1, reason="Unavailable")
    mark_result(status, spec(), SETTINGS, 1, T0)
    assert status["nextRetryTime"]
    mark_suspended(status, True, 1, T0)
    assert "nextRetryTime" not in status and "Reconciling" not in types(status)
    mark_suspended(status, False, 1, T0)
    mark_result(status, spec(), SETTINGS, 1, T0)  # resumed: the retry is planned again
    assert status["nextRetryTime"]


# --- recording results -----------------------------------------------------------------------


def test_success_records_last_update_outputs_and_project_info() -> None:
    status: dict[str, Any] = {"lastFailure": {"reason": "Transient"}}
    upd = update("s-1", permalink="https://app/1", projectInfo={"name": "proj", "runtime": "yaml"})
    record_succeeded(status, current("s-1", request="r"), upd, {"password": "[secret]"}, T0)
    assert status["lastUpdate"] == {
        "generation": 1,
        "reconcileRequest": "r",
        "name": "s-1",
        "type": "up",
        "state": "succeeded",
        "lastAttemptedCommit": "r1",
        "lastSuccessfulCommit": "r1",
        "permalink": "https://app/1",
        "lastResyncTime": "2024-10-17T20:00:00Z",
        "failures": 0,
    }
    assert status["outputs"] == {"password": "[secret]"}
    assert status["projectInfo"] == {"name": "proj", "runtime": "yaml"}
    assert "lastFailure" not in status


def test_outputs_secret_values_are_json_and_secret_keys_are_masked() -> None:
    def b64(value: Any) -> str:
        return base64.b64encode(json.dumps(value).encode()).decode()

    secret = {
        "metadata": {"annotations": {"pulumi.com/secrets": '["password"]'}},
        "data": {"password": b64("hunter2"), "count": b64(3), "obj": b64({"a": [1]})},
    }
    assert outputs_from_secret(secret) == {"count": 3, "obj": {"a": [1]}, "password": "[secret]"}


def test_failures_count_only_for_the_same_generation_request_and_revision() -> None:
    status: dict[str, Any] = {}
    record_failed(status, current("s-1"), update("s-1", failed="ProgramError", message="boom"), T0)
    assert status["lastUpdate"]["failures"] == 0 and status["lastUpdate"]["state"] == "failed"
    assert status["lastFailure"] == {
        "reason": "ProgramError",
        "message": "boom",
        "transient": False,
        "updateName": "s-1",
        "countedFailures": 1,
    }
    record_failed(status, current("s-2"), update("s-2", failed="ProgramError"), T0)
    assert status["lastUpdate"]["failures"] == 1 and status["lastFailure"]["countedFailures"] == 2
    # a new source revision resets (the Go operator kept counting: a new commit could stall at once)
    record_failed(status, current("s-3", commit="r2"), update("s-3", failed="ProgramError"), T0)
    assert status["lastUpdate"]["failures"] == 0 and status["lastFailure"]["countedFailures"] == 1
    record_failed(status, current("s-4", commit="r2", generation=2), update("s-4", failed="ProgramError"), T0)
    assert status["lastUpdate"]["failures"] == 0


def test_last_successful_commit_survives_a_failure() -> None:
    status: dict[str, Any] = {}
    record_succeeded(status, current("s-1", commit="c1"), update("s-1"), None, T0)
    record_failed(status, current("s-2", commit="c2"), update("s-2", failed="ProgramError"), T0)
    assert status["lastUpdate"]["lastSuccessfulCommit"] == "c1"
    assert status["lastUpdate"]["lastAttemptedCommit"] == "c2"


def test_transient_failures_do_not_spend_the_budget() -> None:
    status: dict[str, Any] = {}
    record_failed(status, current("s-1"), update("s-1", failed="ProgramError"), T0)
    record_failed(status, current("s-2"), update("s-2", failed="UpdateConflict"), T0)
    assert status["lastFailure"]["transient"] is True and status["lastFailure"]["countedFailures"] == 1


def test_lost_update_is_a_transient_failure() -> None:
    status: dict[str, Any] = {}
    record_lost(status, current("s-1"), T0)
    assert status["lastUpdate"]["state"] == "failed"
    assert status["lastFailure"]["reason"] == "UpdateLost" and status["lastFailure"]["transient"] is True
    assert "deleted before it completed" in status["lastFailure"]["message"]


# --- result conditions and retries -----------------------------------------------------------


def failed_status(times: int, reason: str = "ProgramError", type_: str = "up") -> dict[str, Any]:
    status: dict[str, Any] = {}
    for i in range(times):
        record_failed(status, current(f"s-{i}"), update(f"s-{i}", type_=type_, failed=reason), T0)
    return status


def test_deterministic_failure_retries_with_the_go_cooldown_then_stalls() -> None:
    s = spec()
    delays = []
    for n in (1, 2, 3):
        status = failed_status(n)
        mark_result(status, s, SETTINGS, 1, T0)
        assert types(status)["Reconciling"] == ("True", "RetryingAfterFailure", f"{n - 1} update failure(s)")
        delays.append(
            (datetime.fromisoformat(status["nextRetryTime"].replace("Z", "+00:00")) - T0).total_seconds()
        )
    assert delays == [10, 30, 90]
    status = failed_status(4)
    mark_result(status, s, SETTINGS, 1, T0)
    assert types(status)["Stalled"] == (
        "True",
        "UpdateFailed",
        "up failed 3 times; not retrying until the spec or source changes",
    )
    assert "nextRetryTime" not in status and "Reconciling" not in types(status)


def test_per_stack_failure_budget_and_backoff_cap() -> None:
    status = failed_status(2)
    mark_result(status, spec(maxUpdateFailures=1), SETTINGS, 1, T0)
    assert types(status)["Stalled"][1] == "UpdateFailed"
    assert deterministic_delay(5, for_stack(spec(retryMaxBackoffDurationSeconds=60), SETTINGS)) == 60
    assert deterministic_delay(20, SETTINGS) == 24 * 3600


def test_transient_failures_back_off_fast_with_jitter_and_never_stall() -> None:
    status = failed_status(8, reason="Unavailable")
    mark_result(status, spec(), SETTINGS, 1, T0)
    assert types(status)["Reconciling"][1] == "RetryingAfterFailure"
    retry_in = (datetime.fromisoformat(status["nextRetryTime"].replace("Z", "+00:00")) - T0).total_seconds()
    assert 240 <= retry_in <= 300  # jittered (+-20%), and never beyond the 5 min cap
    capped_at_60 = for_stack(spec(retryMaxBackoffDurationSeconds=60), SETTINGS)
    capped = {transient_delay(12, capped_at_60, f"c-{i}") for i in range(20)}
    assert max(capped) <= 60  # the Stack's cap holds after the jitter
    first = transient_delay(0, SETTINGS, "a")
    assert 4 <= first <= 6
    assert {round(transient_delay(0, SETTINGS, f"s-{i}"), 3) for i in range(20)} != {5.0}
    assert jitter_fraction("x", 0.2) == jitter_fraction("x", 0.2)


def test_preview_stack_ends_failed_instead_of_retrying_a_deterministic_failure() -> None:
    status = failed_status(1, type_="preview")
    mark_result(status, spec(preview=True), SETTINGS, 1, T0)
    assert types(status)["Stalled"] == (
        "True",
        "UpdateFailed",
        "preview failed 1 times; not retrying until the spec or source changes",
    )
    status = failed_status(1, reason="Unavailable", type_="preview")
    mark_result(status, spec(preview=True), SETTINGS, 1, T0)
    assert types(status)["Reconciling"] == ("True", "PreviewFailed", "preview failed (0 attempt(s))")


def test_success_is_ready_and_clears_next_retry_time() -> None:
    status = failed_status(1)
    status["nextRetryTime"] = "x"
    record_succeeded(status, current("ok"), update("ok"), None, T0)
    mark_result(status, spec(), SETTINGS, 1, T0)
    assert types(status) == {
        "Ready": ("True", "ProcessingCompleted", "the stack has been processed and is up to date")
    }
    assert "nextRetryTime" not in status


# --- plan_sync (Go: isSynced) ----------------------------------------------------------------


def succeeded(
    commit: str = "r1", generation: int = 1, request: str = "", at: datetime = T0
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    record_succeeded(status, current("s-1", generation, commit, request), update("s-1"), None, at)
    return status


def test_plan_runs_first_update_new_generation_request_and_commit() -> None:
    s = spec()
    assert plan_sync(stack_obj(), s, {}, "r1", T0, SETTINGS).message == "Initial stack update"
    assert plan_sync(stack_obj(2), s, succeeded(), "r1", T0, SETTINGS).message == "New stack generation: 2"
    assert plan_sync(stack_obj(1, "now"), s, succeeded(), "r1", T0, SETTINGS).message == 'Sync request: "now"'
    assert plan_sync(stack_obj(), s, succeeded(), "r2", T0, SETTINGS).message == 'New commit detected: "r2"'
    decision = plan_sync(stack_obj(), s, succeeded(), "r1", T0, SETTINGS)
    assert decision.synced and decision.requeue_after is None


def test_plan_resyncs_with_continue_resync_on_commit_match() -> None:
    s = spec(continueResyncOnCommitMatch=True, resyncFrequencySeconds=300)
    early = plan_sync(stack_obj(), s, succeeded(), "r1", T0 + timedelta(seconds=100), SETTINGS)
    assert early.synced and early.requeue_after == 200
    late = plan_sync(stack_obj(), s, succeeded(), "r1", T0 + timedelta(seconds=300), SETTINGS)
    assert not late.synced and late.message == "Resync time elapsed: 5m0s"


def test_plan_polls_a_branch_at_the_resync_frequency_at_least_a_minute() -> None:
    s = spec(resyncFrequencySeconds=10)
    decision = plan_sync(stack_obj(), s, succeeded(), "r1", T0, SETTINGS, polls_branch=True)
    assert decision.synced and decision.requeue_after is not None and 30 <= decision.requeue_after < 90
    # On its tick, the next poll is one interval later.
    tick = T0 + timedelta(seconds=decision.requeue_after)
    later = plan_sync(stack_obj(), s, succeeded(), "r1", tick, SETTINGS, polls_branch=True)
    assert later.requeue_after is not None and abs(later.requeue_after - 60) < 1e-6


def test_branch_polls_of_a_fleet_are_spread_over_the_interval_and_stay_put() -> None:
    """A fleet reconciled all at once (an operator start) polls spread over the whole interval,
    each Stack at its own phase, which no extra reconcile moves."""
    s = spec(resyncFrequencySeconds=600)
    ticks = []
    for i in range(400):
        obj = stack_obj()
        obj["metadata"]["uid"] = f"uid-{i}"
        decision = plan_sync(obj, s, succeeded(), "r1", T0, SETTINGS, polls_branch=True)
        assert decision.requeue_after is not None and 300 <= decision.requeue_after < 900
        tick = T0 + timedelta(seconds=decision.requeue_after)
        ticks.append(tick.timestamp() % 600)
        # an extra reconcile 100 s later aims at the same tick
        extra = plan_sync(obj, s, succeeded(), "r1", T0 + timedelta(seconds=100), SETTINGS, polls_branch=True)
        assert extra.requeue_after is not None
        assert abs((T0 + timedelta(seconds=100 + extra.requeue_after) - tick).total_seconds()) in (0.0, 600.0)
    buckets = [0] * 10  # polls per tenth of the interval: about 40 each
    for t in ticks:
        buckets[int(t // 60)] += 1
    assert max(buckets) < 2 * min(buckets), buckets


def test_plan_retries_after_the_backoff_and_stops_when_stalled() -> None:
    s = spec()
    status = failed_status(1)
    waiting = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=4), SETTINGS)
    assert waiting.synced and waiting.requeue_after == 6
    due = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=10), SETTINGS)
    assert not due.synced and due.message == "Backoff time elapsed: 10s"
    stalled = plan_sync(stack_obj(), s, failed_status(4), "r1", T0 + timedelta(days=2), SETTINGS)
    assert stalled.synced and stalled.requeue_after is None
    new_commit = plan_sync(stack_obj(), s, failed_status(4), "r2", T0, SETTINGS)
    assert not new_commit.synced


def test_plan_on_deletion_destroys_once() -> None:
    s = spec(destroyOnFinalize=True)
    assert plan_sync(stack_obj(2, deleting=True), s, succeeded(), "r1", T0, SETTINGS).message == (
        "Stack marked for deletion"
    )
    destroyed: dict[str, Any] = {}
    record_succeeded(destroyed, current("d", generation=2), update("d", type_="destroy"), None, T0)
    assert plan_sync(stack_obj(2, deleting=True), s, destroyed, "r1", T0, SETTINGS).synced


# --- prerequisites ---------------------------------------------------------------------------


def prereq(status: dict[str, Any], generation: int = 1, request: str | None = None) -> dict[str, Any]:
    obj = stack_obj(generation, request)
    obj["status"] = status
    return obj


def test_prerequisite_requirements() -> None:
    def message(obj: dict[str, Any], within: timedelta | None = None, now: datetime = T0) -> str | None:
        error = requirement_error(obj, within, now)
        return None if error is None else error.message

    assert message(prereq({})) == "prerequisite has not run to completion"
    assert message(prereq(succeeded(), 2)) == "prerequisite has not run to completion"
    assert message(prereq(succeeded(), 1, "again")) == "prerequisite has not run to completion"
    assert message(prereq(failed_status(1))) == "prerequisite failed"
    assert message(prereq(succeeded())) is None
    old = requirement_error(prereq(succeeded()), timedelta(minutes=5), T0 + timedelta(hours=1))
    assert old is not None and old.message == "prerequisite is out of date" and old.touch == "after-s-1"


# --- classification --------------------------------------------------------------------------


def test_failure_classification_is_closed_and_reads_lock_owner_and_pending_urns() -> None:
    assert classify_failure("UpdateConflict", "").transient
    assert classify_failure("InvalidAccessToken", "").reason == "AuthFailed"
    assert classify_failure("InstallationFailed", "").reason == "InstallFailed"
    locked = classify_failure("StackLocked", "the stack is locked by alice@host (pid 42)")
    assert locked.transient and locked.lock_owner == "alice@host (pid 42)"
    pending = classify_failure(
        "PendingOperations",
        "the stack has 1 pending operation(s): urn:pulumi:dev::p::random:index:RandomPet::a",
    )
    assert not pending.transient and pending.pending_operations == (
        "urn:pulumi:dev::p::random:index:RandomPet::a",
    )
    assert classify_failure("UpdateFailed", "error: 503 Service Unavailable").reason == "Transient"
    assert (
        classify_failure("UpdateFailed", "Missing required configuration variable 'x'").reason
        == "ConfigInvalid"
    )
    assert classify_failure("UpdateFailed", "error: something odd").reason == "OperationFailed"
    assert classify_failure(None, "").reason == "OperationFailed"
    # The Update controller's reasons for an operation its workspace pod lost or could not serve.
    assert classify_failure("OperationLost", "the workspace agent no longer knows this operation").transient
    assert classify_failure("AgentUnreachable", "lost contact with the workspace agent for 30s").transient
    assert classify_failure("AgentRestarted", "the agent stopped before the operation finished").transient


def test_message_keeps_the_last_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(30))
    assert tail_lines(text).splitlines() == [f"line {i}" for i in range(20, 30)]
    assert len(tail_lines("x" * 5000)) == 2000


def test_go_duration_format() -> None:
    assert [go_duration(s) for s in (10, 90, 3600, 86400)] == ["10s", "1m30s", "1h0m0s", "24h0m0s"]


def test_status_fields_are_recorded_with_get_condition_helpers() -> None:
    status: dict[str, Any] = {}
    mark_reconciling(status, "StackProcessing", "stack is being processed", 3, T0)
    condition = get_condition(status["conditions"], "Reconciling")
    assert condition is not None and condition["lastTransitionTime"] == "2024-10-17T20:00:00Z"


# --- what the stack holds, and a destroy that found none of it (issue 30) -----------------------


def test_the_resource_count_follows_each_successful_update() -> None:
    status: dict[str, Any] = {}
    changes = {"create": 2, "same": 1, "delete": 1}
    record_succeeded(status, current("s-1"), update("s-1", resourceChanges=changes), None, T0)
    assert status["resourceCount"] == 3  # what was deleted is no longer held
    record_succeeded(status, current("s-2"), update("s-2", type_="preview"), None, T0)
    assert status["resourceCount"] == 3  # a preview changes nothing
    record_succeeded(status, current("s-3"), update("s-3"), None, T0)
    assert status["resourceCount"] == 3  # an Update that did not say keeps what was known
    assert resources_after(update("s-4", type_="refresh", resourceChanges={"same": 2, "delete": 1})) == 2
    assert resources_after(update("s-5", type_="destroy")) == 0


def test_a_destroy_that_deleted_none_of_the_known_resources_is_not_done() -> None:
    known = {"resourceCount": 3}
    empty = update("s-9", type_="destroy")
    empty["spec"]["stackName"] = "dev"
    message = destroyed_nothing(known, empty)
    assert message is not None and "'dev'" in message and "3 resource(s)" in message
    deleted = update("s-9", type_="destroy", resourceChanges={"delete": 3})
    assert destroyed_nothing(known, deleted) is None
    assert destroyed_nothing({}, empty) is None  # nothing was known to be there
    assert destroyed_nothing({"resourceCount": 0}, empty) is None
    assert destroyed_nothing(known, update("s-9", type_="up")) is None

    status: dict[str, Any] = {"resourceCount": 3, "outputs": {"url": "x"}}
    record_destroyed_nothing(status, current("s-9"), empty, message, T0)
    assert status["lastUpdate"]["state"] == "failed" and status["lastUpdate"]["type"] == "destroy"
    assert status["lastFailure"]["reason"] == "StackNotFound" and not status["lastFailure"]["transient"]
    assert status["resourceCount"] == 3  # still what the Stack last deployed


def test_a_stack_missing_from_its_backend_stalls_at_once_with_what_to_do() -> None:
    status: dict[str, Any] = {"resourceCount": 2, "outputs": {"configMap": "hello", "url": "[secret]"}}
    missing = update(
        "s-7",
        type_="destroy",
        failed="StackNotFound",
        message="stack 'dev' not found in backend file:///state",
    )
    record_failed(status, current("s-7"), missing, T0)
    mark_result(status, spec(destroyOnFinalize=True), SETTINGS, 1, T0, stack=StackRef("s", "ns"))
    stalled = types(status)["Stalled"]
    assert stalled[:2] == ("True", "StackNotFound")
    assert stalled[2].startswith("stack 'dev' not found in backend file:///state; nothing was destroyed.")
    assert "2 resource(s) and outputs configMap, url" in stalled[2]
    assert "kubectl annotate stack s -n ns --overwrite pulumi.com/reconciliation-request=" in stalled[2]
    assert """kubectl patch stack s -n ns --type=merge -p '{"metadata":{"finalizers":[]}}'""" in stalled[2]
    assert "nextRetryTime" not in status and "Reconciling" not in types(status)
    # not a deletion (useLocalStackOnly): no word of destroying or releasing
    status = {}
    record_failed(status, current("s-8"), update("s-8", failed="StackNotFound", message="gone"), T0)
    mark_result(status, spec(), SETTINGS, 1, T0, stack=StackRef("s", "ns"))
    assert types(status)["Stalled"][1] == "StackNotFound"
    assert "destroy" not in types(status)["Stalled"][2] and "finalizers" not in types(status)["Stalled"][2]


# --- tunable retries (issue 28) ---------------------------------------------------------------


def retry_in(status: dict[str, Any]) -> float:
    """Seconds from the failure (at T0) to ``status.nextRetryTime``."""
    return (datetime.fromisoformat(status["nextRetryTime"].replace("Z", "+00:00")) - T0).total_seconds()


def test_without_settings_the_backoff_is_the_built_in_one() -> None:
    assert (SETTINGS.transient_base, SETTINGS.transient_factor, SETTINGS.transient_cap, SETTINGS.jitter) == (
        5.0,
        2.0,
        300.0,
        0.2,
    )
    assert (SETTINGS.deterministic_base, SETTINGS.deterministic_factor, SETTINGS.max_backoff) == (
        10.0,
        3.0,
        86400.0,
    )
    # A Stack that sets nothing (or 0, upstream's "unset") takes the operator's settings as they are.
    assert for_stack(spec(), SETTINGS) == SETTINGS
    unset = spec(retryPolicy={"transient": {}}, retryMaxBackoffDurationSeconds=0)
    assert for_stack(unset, SETTINGS) == SETTINGS
    assert [deterministic_delay(n, SETTINGS) for n in range(10)] == [
        10, 30, 90, 270, 810, 2430, 7290, 21870, 65610, 86400,
    ]  # fmt: skip


def test_operator_settings_shape_both_backoffs() -> None:
    settings = RetrySettings(
        transient_base=2, transient_factor=3, transient_cap=60, jitter=0,
        deterministic_base=30, deterministic_factor=2, max_backoff=600,
    )  # fmt: skip
    assert [transient_delay(n, settings, "u") for n in range(6)] == [2, 6, 18, 54, 60, 60]
    assert [deterministic_delay(n, settings) for n in range(7)] == [30, 60, 120, 240, 480, 600, 600]
    fixed = RetrySettings(transient_factor=1, deterministic_factor=1, jitter=0)
    assert {transient_delay(n, fixed, "u") for n in range(50)} == {5}
    assert {deterministic_delay(n, fixed) for n in range(50)} == {10}


def test_a_stack_overrides_each_setting_it_names_and_keeps_the_operators_others() -> None:
    operator = RetrySettings(transient_cap=120, max_update_failures=5)
    policy = {"transient": {"baseSeconds": 1, "jitter": 0}, "deterministic": {"factor": 1.5}}
    expected = replace(operator, transient_base=1, jitter=0, deterministic_factor=1.5)
    assert for_stack(spec(retryPolicy=policy), operator) == expected
    full = spec(
        maxUpdateFailures=1,
        retryMaxBackoffDurationSeconds=900,
        retryPolicy={
            "transient": {"baseSeconds": 3, "factor": 4, "maxSeconds": 700, "jitter": 0.5},
            "deterministic": {"baseSeconds": 20, "factor": 2},
        },
    )
    assert for_stack(full, operator) == RetrySettings(
        max_update_failures=1, deterministic_base=20, deterministic_factor=2, transient_base=3,
        transient_factor=4, transient_cap=700, jitter=0.5, max_backoff=900,
    )  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [
        RetrySettings(),
        RetrySettings(jitter=0.9),
        RetrySettings(transient_cap=2.5, jitter=0.5),  # a cap in fractions of a second: never rounded up
        RetrySettings(transient_cap=7, max_backoff=3),  # the longest wait of any retry wins
    ],
    ids=["defaults", "wide-jitter", "fractional-cap", "max-backoff-below-transient-cap"],
)
def test_the_cap_is_the_longest_wait_whatever_the_jitter_and_rounding(settings: RetrySettings) -> None:
    cap = min(settings.transient_cap, settings.max_backoff)
    for n in range(40):
        for i in range(25):
            assert transient_delay(n, settings, f"u-{i}") <= cap
            whole = retry_delay(transient=True, failures=n, spec=spec(), settings=settings, seed=f"u-{i}")
            assert whole == int(whole) and 1 <= whole <= cap
        assert deterministic_delay(n, settings) <= settings.max_backoff


def test_a_stacks_max_backoff_caps_its_own_longer_transient_cap() -> None:
    policy = {"transient": {"baseSeconds": 20, "maxSeconds": 600}}
    s = spec(retryMaxBackoffDurationSeconds=30, retryPolicy=policy)
    assert retry_delay(transient=True, failures=5, spec=s, settings=SETTINGS, seed="u") == 30
    assert retry_delay(transient=False, failures=5, spec=s, settings=SETTINGS, seed="u") == 30


def test_huge_factors_and_failure_counts_stay_at_the_cap() -> None:
    steep = RetrySettings(transient_factor=1e300, deterministic_factor=1e300)
    assert deterministic_delay(100_000, steep) == steep.max_backoff
    assert transient_delay(100_000, steep, "u") == steep.transient_cap


@pytest.mark.parametrize(
    "bad",
    [
        {"transient_factor": 0.5},
        {"deterministic_factor": 0},
        {"transient_base": 0},
        {"deterministic_base": -10},
        {"transient_cap": 0.5},
        {"max_backoff": math.inf},
        {"jitter": 1},
        {"jitter": -0.1},
        {"jitter": math.nan},
        {"max_update_failures": -1},
    ],
    ids=lambda bad: f"{next(iter(bad))}={next(iter(bad.values()))}",
)
def test_nonsense_settings_are_refused_naming_the_setting(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"invalid retry settings: {next(iter(bad))} must"):
        RetrySettings(**bad)


def test_a_stack_policy_sets_next_retry_time_and_a_fix_starts_the_backoff_over() -> None:
    s = spec(maxUpdateFailures=10, retryPolicy={"deterministic": {"baseSeconds": 7, "factor": 2}})
    delays = []
    for n in (1, 2, 3, 4):
        status = failed_status(n)
        mark_result(status, s, SETTINGS, 1, T0)
        delays.append(retry_in(status))
    assert delays == [7, 14, 28, 56]
    waiting = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=50), SETTINGS)
    assert waiting.synced and waiting.requeue_after == 6
    due = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=56), SETTINGS)
    assert not due.synced and due.message == "Backoff time elapsed: 56s"
    # The user fixes the cause (a new generation, commit or request): it runs at once...
    assert plan_sync(stack_obj(2), s, status, "r1", T0, SETTINGS).message == "New stack generation: 2"
    assert plan_sync(stack_obj(), s, status, "r2", T0, SETTINGS).message == 'New commit detected: "r2"'
    assert plan_sync(stack_obj(1, "fixed"), s, status, "r1", T0, SETTINGS).message == 'Sync request: "fixed"'
    # ...and should it fail again, the backoff starts over from the base.
    record_failed(status, current("s-9", generation=2), update("s-9", failed="ProgramError"), T0)
    mark_result(status, s, SETTINGS, 2, T0)
    assert retry_in(status) == 7 and status["lastFailure"]["countedFailures"] == 1


def test_a_cause_that_goes_away_is_picked_up_within_the_stacks_transient_bound() -> None:
    s = spec(retryPolicy={"transient": {"baseSeconds": 2, "factor": 3, "maxSeconds": 40, "jitter": 0}})
    delays = []
    for n in range(1, 7):
        status = failed_status(n, reason="Unavailable")
        mark_result(status, s, SETTINGS, 1, T0)
        delays.append(retry_in(status))
        assert plan_sync(stack_obj(), s, status, "r1", T0, SETTINGS).requeue_after == delays[-1]
    assert delays == [2, 6, 18, 40, 40, 40]
    assert types(status)["Reconciling"][1] == "RetryingAfterFailure"  # never Stalled
