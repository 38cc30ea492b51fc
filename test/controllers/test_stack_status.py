"""A Stack's status (pure): its conditions as upstream's (reasons and messages), what each finished
Update records, and what the stack holds (a destroy that found none of it is not done). Retries:
test_stack_retry.py; the "what next" decision: test_stack_sync.py."""

from __future__ import annotations

import base64
import json
from typing import Any

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
    record_destroyed_nothing,
    record_failed,
    record_lost,
    record_succeeded,
    resources_after,
)
from pko.machinery.conditions import get_condition

from .builders import SETTINGS, T0, current, failed_status, spec, types, update

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
