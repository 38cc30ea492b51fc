"""What the Update reconcile's pure tests share (``test_update_plan.py``, ``test_update_refused.py``): an
Update and what the reconcile observes of it, and the assertions on a plan."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from pko.api.generated.pko.agent import v1 as pb

from pko.controllers.update import status as us
from pko.controllers.update.plan import (
    TRANSIENT_REQUEUE,
    Emit,
    Failure,
    ForgetOutcome,
    KeepOutcome,
    Log,
    Observed,
    Outcome,
    Plan,
    SelectAndStart,
    WriteStatus,
    decide,
    refused,
)
from pko.machinery.conditions import get_condition
from pko.machinery.controller import Result

from . import builders

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
UID = builders.UPDATE_UID
KEY = "ns/s-18f"
READY_WS: dict[str, Any] = {
    "metadata": {"name": "s", "namespace": "ns"},
    "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}]},
}


make_update = functools.partial(builders.make_update, generation=1, owned=True)


def running(update: dict[str, Any]) -> dict[str, Any]:
    update["status"] = us.started_status(update, NOW - timedelta(minutes=5))
    return update


def completed(update: dict[str, Any], ended: datetime) -> dict[str, Any]:
    update["status"] = us.ended_status(update, us.REASON_CANCELED, "x", ended)
    return update


def observed(update: dict[str, Any] | None, **kw: Any) -> Observed:
    kw.setdefault("workspace", READY_WS)
    return Observed(KEY, update, NOW, **kw)


succeeded = functools.partial(builders.succeeded, UID)


def failed_result() -> pb.OperationResult:
    return pb.OperationResult(
        operation_id=UID,
        type=pb.OperationType.PREVIEW,
        state=pb.OperationState.FAILED,
        stderr="boom\nmore",
        failure=pb.Failure(reason="UpdateFailed"),
    )


def kinds(plan: Plan) -> list[str]:
    return [type(w).__name__ for w in plan.writes]


def cond(status: dict[str, Any], type_: str) -> tuple[str, str, str]:
    c = get_condition(status["conditions"], type_)
    assert c is not None
    return c["status"], c["reason"], c.get("message", "")


def only_status(plan: Plan, index: int = 0) -> dict[str, Any]:
    write = plan.writes[index]
    assert isinstance(write, WriteStatus)
    return write.status


def assert_ended(plan: Plan, reason: str, message: str, *, keep: bool = True) -> None:
    """The plan ends the Update with ``reason``/``message``, in today's order."""
    outcome = Outcome(UID, reason=reason, message=message)
    expected_kinds = ["WriteStatus", "Log", "Emit", "ForgetOutcome"]
    if keep:
        assert plan.writes[0] == KeepOutcome(outcome)
        expected_kinds.insert(0, "KeepOutcome")
    assert kinds(plan) == expected_kinds
    write = plan.writes[-4]
    assert isinstance(write, WriteStatus) and write.outcome == outcome
    assert cond(write.status, "Failed")[:2] == ("True", reason)
    assert cond(write.status, "Complete")[:2] == ("True", "Failed")
    assert write.status["message"] == message
    assert plan.writes[-3] == Log("update ended", {"update": KEY, "reason": reason, "message": message})
    assert plan.writes[-2] == Emit("Warning", "UpdateFailed", f"{reason}: {message}")
    assert plan.writes[-1] == ForgetOutcome(UID)
    assert plan.result == Result.done() and plan.then is None


def start_refused(failure: Failure) -> Plan | None:
    update = make_update()
    write = decide(observed(update)).writes[0]
    assert isinstance(write, SelectAndStart)
    return refused(observed(update), write, failure, NOW)


def assert_transient_wait(plan: Plan | None, message: str) -> None:
    assert plan is not None
    assert kinds(plan) == ["WriteStatus"]
    assert plan.result == Result.requeue_after(TRANSIENT_REQUEUE)
    assert cond(only_status(plan), "Progressing") == ("False", "TransientFailure", message)
