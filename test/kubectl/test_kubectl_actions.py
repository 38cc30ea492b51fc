"""``retry``, ``refresh``, ``cancel`` and ``logs`` (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pko.kubectl.actions import (
    CANCEL_REQUEST_ANNOTATION,
    REFRESH_REQUEST_ANNOTATION,
    annotation,
    current_request,
    done,
    notes,
    outcome,
    refresh_retrying,
    retry_notes,
    retry_value,
)
from pko.kubectl.logs import chosen_update, engine_lines, workspace_pod

from .stacks import NOW, ready_status, retrying_status, stack, update


def test_retry_value_is_fresh() -> None:
    assert retry_value(NOW, "") == "2025-01-20T10:45:00.000000Z"
    assert retry_value(NOW, "2025-01-20T10:45:00.000000Z") == "2025-01-20T10:45:00.000000Z-1"
    later = datetime(2025, 1, 20, 10, 45, 0, 1, tzinfo=UTC)
    assert retry_value(later, retry_value(NOW, "")) != retry_value(NOW, "")
    annotated = stack()
    annotated["metadata"]["annotations"] = {
        "pulumi.com/reconciliation-request": "x",
        REFRESH_REQUEST_ANNOTATION: "r",
    }
    assert current_request(annotated) == "x" and current_request(stack()) == ""
    assert annotation(annotated, REFRESH_REQUEST_ANNOTATION) == "r"


def test_retry_notes() -> None:
    assert retry_notes(stack(status=ready_status())) == []
    busy = retrying_status()
    busy["currentUpdate"] = {"name": "web-3"}
    assert retry_notes(stack(status=busy, suspend=True)) == [
        "Update web-3 is running: the retry starts once it ends.",
        "spec.suspend is set: nothing runs until it is cleared.",
    ]
    assert notes("retry", stack(status=busy)) == retry_notes(stack(status=busy))


def test_refresh_notes_say_when_it_runs() -> None:
    assert notes("refresh", stack(status=ready_status())) == []
    busy = ready_status()
    busy["currentUpdate"] = {"name": "web-3"}
    assert notes("refresh", stack(status=busy)) == [
        "Update web-3 is running: the refresh starts once it ends."
    ]
    assert notes("refresh", stack(status=busy, suspend=True)) == [
        "spec.suspend is set: the refresh runs once it is cleared."
    ]
    deleted = stack(status=ready_status())
    deleted["metadata"]["deletionTimestamp"] = "2025-01-20T10:44:00Z"
    assert notes("refresh", deleted) == ["The Stack is being deleted: no refresh runs."]


def test_cancel_notes_say_when_nothing_runs() -> None:
    assert notes("cancel", stack(status=ready_status())) == [
        "No Update is running: the operator records the request and cancels nothing."
    ]
    busy = ready_status()
    busy["currentUpdate"] = {"name": "web-3"}
    assert notes("cancel", stack(status=busy)) == []


def test_a_refresh_is_done_once_recorded_and_says_how_it_ended() -> None:
    status = ready_status()
    assert not done("refresh", stack(status=status), "t1")
    status["observedRefreshRequest"] = "t0"
    assert not done("refresh", stack(status=status), "t1")
    status["observedRefreshRequest"] = "t1"
    status["lastRefresh"] = {"name": "web-r", "token": "t1", "state": "succeeded", "failures": 0}
    ran = stack(status=status)
    assert done("refresh", ran, "t1")
    said = outcome("refresh", ran, "t1", ran)
    assert (said.text, said.failed) == ("refresh t1 done: Update web-r succeeded.", False)
    status["lastRefresh"].update(
        state="failed", reason="ProgramError", message="error: 403\n  getting   the pod"
    )
    said = outcome("refresh", stack(status=status), "t1", ran)
    assert (said.text, said.failed) == (
        "refresh t1 done: Update web-r failed. error: 403 getting the pod",
        True,
    )


def test_a_refresh_retried_after_a_transient_failure_is_not_done() -> None:
    status = ready_status()
    stopped = "the agent stopped before the operation finished"
    status["lastRefresh"] = {"name": "web-r", "token": "t1", "state": "failed", "reason": "Transient",
                             "message": stopped, "failures": 2}  # fmt: skip
    retrying = stack(status=status)
    assert not done("refresh", retrying, "t1")
    assert refresh_retrying(retrying, "t1") == (
        "failed 2 time(s) for a transient cause (Transient): the agent stopped before the operation "
        "finished; the operator retries it"
    )
    assert refresh_retrying(retrying, "t2") == ""  # another request: not its refresh
    status["observedRefreshRequest"] = "t1"  # failed for good
    assert refresh_retrying(stack(status=status), "t1") == ""


def test_a_cancel_is_done_once_the_cancelled_update_ended() -> None:
    running = ready_status()
    running["currentUpdate"] = {"name": "web-3"}
    before = stack(status=running)
    assert not done("cancel", before, "c1")
    # Recorded, the Update marked, still in flight: not done yet.
    marked = ready_status()
    marked["observedCancelRequest"] = "c1"
    marked["currentUpdate"] = {"name": "web-3", "cancelRequest": "c1"}
    assert not done("cancel", stack(status=marked), "c1")
    ended = retrying_status()
    ended["observedCancelRequest"] = "c1"
    ended["lastFailure"].update(reason="Cancelled", updateName="web-3")
    assert done("cancel", stack(status=ended), "c1")
    assert (
        outcome("cancel", stack(status=ended), "c1", before).text == "cancel c1 done: Update web-3 cancelled."
    )
    # Nothing was running when it was asked.
    idle = ready_status()
    idle["observedCancelRequest"] = "c2"
    assert done("cancel", stack(status=idle), "c2")
    assert (
        outcome("cancel", stack(status=idle), "c2", stack(status=ready_status())).text
        == "cancel c2 done: no Update was running."
    )
    # The Update ended by itself before the cancel reached it.
    finished = ready_status()
    finished["observedCancelRequest"] = "c1"
    finished["lastUpdate"]["name"] = "web-3"
    assert outcome("cancel", stack(status=finished), "c1", before).text == (
        "cancel c1 done: Update web-3 had ended (succeeded) first."
    )
    assert CANCEL_REQUEST_ANNOTATION == "pulumi.com/cancel-request"


def test_chosen_update_running_then_last() -> None:
    busy = retrying_status()
    assert chosen_update(stack(status=busy), None) == "web-2"
    busy["currentUpdate"] = {"name": "web-3"}
    assert chosen_update(stack(status=busy), None) == "web-3"
    assert chosen_update(stack(status=busy), "web-1") == "web-1"
    assert chosen_update(stack(), None) is None
    assert workspace_pod(update(), "web") == ("web", "web-workspace-0")


def test_engine_lines_of_one_operation() -> None:
    def entry(msg: str, operation: str, **kw: str) -> str:
        return json.dumps({"level": "info", "ts": "t", "msg": msg, "operation": operation, **kw})

    log = "\n".join(
        [
            entry("operation started", "u1", type="up"),
            entry("pulumi", "u1", line="Updating (dev):"),
            entry("pulumi", "u2", line="another operation"),
            "not json at all",
            "{broken",
            entry("pulumi", "u1", line="    + random:RandomPet pet created"),
            entry("operation succeeded", "u1"),
        ]
    )
    assert engine_lines(log, "u1") == ["Updating (dev):", "    + random:RandomPet pet created"]
    assert engine_lines(log, "u3") == []
