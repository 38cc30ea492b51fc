"""How an ended Update's result is recorded in the Stack's status, by what it was for (pure).

One recorder per way of recording (:data:`pko.controllers.stack.kinds.Records`): each takes the
Stack's status (changed in place), ``status.currentUpdate``, the Update as it ended, its outputs
(None: none were read), the Stack's generation and the time, and returns the Events that say what
happened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final

from pko.controllers.stack.approval import record_plan
from pko.controllers.stack.drift import record_drift, record_drift_failure
from pko.controllers.stack.kinds import Records
from pko.controllers.stack.refresh import record_refresh
from pko.controllers.stack.status import (
    destroyed_nothing,
    record_destroyed_nothing,
    record_failed,
    record_succeeded,
)
from pko.machinery.conditions import get_condition, is_true
from pko.machinery.events import Emit
from pko.machinery.resource import Obj

__all__ = ["RECORDERS", "Recorder", "pending_operation_events", "record_update"]

Recorder = Callable[[Obj, Obj, Obj, Obj | None, int, datetime], list[Emit]]
"""``(status, currentUpdate, update, outputs, generation, now) -> Events``."""

_PLAN_GONE: Final = frozenset({"PlanMismatch", "PlanNotFound"})


def record_update(status: Obj, current: Obj, update: Obj, outputs: Obj | None, now: datetime) -> list[Emit]:
    """Record a completed Update's result in ``status`` (``outputs``: from its Secret, None to keep
    the last ones); the Event that says so."""
    conditions = (update.get("status") or {}).get("conditions")
    if is_true(conditions, "Failed"):
        record_failed(status, current, update, now)
        message = (update.get("status") or {}).get("message") or ""
        return [Emit("Warning", "StackUpdateFailure", f"Failed to update stack: {message}")]
    nothing = destroyed_nothing(status, update)
    if nothing is not None:
        record_destroyed_nothing(status, current, update, nothing, now)
        return [Emit("Warning", "StackUpdateFailure", f"Failed to destroy stack: {nothing}")]
    record_succeeded(status, current, update, outputs, now)
    return [Emit("Normal", "StackCreated", "Successfully updated stack")]


def _result(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Emit]:
    return record_update(status, current, update, outputs, now)


def _plan(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Emit]:
    """A plan preview: its plan recorded to await approval; a failed one is a failed update."""
    if is_true((update.get("status") or {}).get("conditions"), "Failed"):
        return record_update(status, current, update, outputs, now)
    plan = record_plan(status, update, now, str(current.get("commit") or ""))
    summary = plan["summary"]
    text = ", ".join(f"{summary[k]} to {k}" for k in ("create", "update", "delete", "replace"))
    return [Emit("Normal", "PlanRecorded", f"plan {plan['digest']} recorded: {text}")]


def _applied(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Emit]:
    """An approved up; one whose plan no longer applies is not a failure: the gate previews again."""
    upd_status = update.get("status") or {}
    reason = (get_condition(upd_status.get("conditions"), "Failed") or {}).get("reason")
    if is_true(upd_status.get("conditions"), "Failed") and reason in _PLAN_GONE:
        message = f"the plan could not be applied ({reason}): previewing again for a new approval"
        return [Emit("Warning", "PlanOutdated", f"{message}: {upd_status.get('message') or ''}")]
    return record_update(status, current, update, outputs, now)


def _refresh(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Emit]:
    token = current.get("cancelRequest")
    return record_refresh(status, update, now, cancel_request=str(token) if token else None)


def _drift(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Emit]:
    if is_true((update.get("status") or {}).get("conditions"), "Failed"):
        return [record_drift_failure(status, update, now)]
    return list(record_drift(status, update, generation, now).events)


RECORDERS: Final[Mapping[Records, Recorder]] = {
    "result": _result,
    "plan": _plan,
    "applied": _applied,
    "refresh": _refresh,
    "drift": _drift,
}


def pending_operation_events(update: Obj) -> list[Emit]:
    """The Stack's word on the pending operations an interrupted update left in the state: the
    agent clears a pending create once it is stale (a later update made the resource again), but
    what the interrupted attempt created may still exist outside Pulumi; pending operations that
    remain after a success need a person."""
    upd_status = update.get("status") or {}
    cleared = [str(op.get("urn") or "") for op in upd_status.get("clearedPendingOperations") or []]
    events: list[Emit] = []
    if cleared:
        events.append(
            Emit(
                "Warning",
                "PendingOperationsCleared",
                f"cleared {len(cleared)} stale pending create(s) an interrupted update left in the state: "
                f"{', '.join(cleared)}; each was created again, so check the provider for a duplicate "
                "the interrupted attempt may have made outside Pulumi",
            )
        )
    failed = is_true(upd_status.get("conditions"), "Failed")
    remaining = [f"{op.get('type')} {op.get('urn')}" for op in upd_status.get("pendingOperations") or []]
    if remaining and not failed:  # a failure already says so in its message
        events.append(
            Emit(
                "Warning",
                "PendingOperations",
                f"{len(remaining)} pending operation(s) remain in the state: {', '.join(remaining)}; "
                "check each resource, then pulumi refresh in the workspace pod to settle them",
            )
        )
    return events
