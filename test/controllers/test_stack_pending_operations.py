"""What a Stack says about the pending operations an interrupted update left in the state (pure):
the agent clears a stale pending create after a later update made the resource again (the
Update's ``status.clearedPendingOperations``); what remains after a success is the user's to check."""

from __future__ import annotations

from typing import Any

from pko.controllers.stack.plan import pending_operation_events
from pko.machinery.events import Emit

URN = "urn:pulumi:dev::p::command:local:Command::step2"


def update(failed: bool = False, **status: Any) -> dict[str, Any]:
    conditions = [
        {"type": "Complete", "status": "True"},
        {
            "type": "Failed",
            "status": "True" if failed else "False",
            "reason": "StackLocked" if failed else "",
        },
    ]
    return {"status": {"conditions": conditions, **status}}


def test_a_cleared_stale_create_is_a_warning_naming_its_urn() -> None:
    (event,) = pending_operation_events(update(clearedPendingOperations=[{"urn": URN, "type": "creating"}]))
    assert isinstance(event, Emit)
    assert (event.type, event.reason) == ("Warning", "PendingOperationsCleared")
    assert URN in event.message and "duplicate" in event.message


def test_operations_left_after_a_success_are_a_warning_but_a_failure_already_says_so() -> None:
    left = {"pendingOperations": [{"urn": URN, "type": "creating"}]}
    (event,) = pending_operation_events(update(**left))
    assert isinstance(event, Emit)
    assert event.reason == "PendingOperations" and f"creating {URN}" in event.message
    assert pending_operation_events(update(failed=True, **left)) == []


def test_nothing_pending_says_nothing() -> None:
    assert pending_operation_events(update()) == []
    assert pending_operation_events({}) == []
