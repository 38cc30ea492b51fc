"""Steps 0 and 1 of a Stack reconcile: the Update in flight, cancelled on request, waited for, or
its result recorded once it ended (pure).

What is recorded, and what a lost or cancelled Update leaves, is read from its kind's row
(:mod:`pko.controllers.stack.kinds`); the recording itself is :mod:`pko.controllers.stack.results`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pko.api.stack import Stack
from pko.controllers.resources import CANCEL_REQUEST_ANNOTATION
from pko.controllers.stack.ensure import mark_workspace_stalled, unservable_workspace
from pko.controllers.stack.kinds import recorded_kind
from pko.controllers.stack.policyevents import policy_violation_events
from pko.controllers.stack.policypacks import git_packs
from pko.controllers.stack.results import RECORDERS, pending_operation_events
from pko.controllers.stack.status import MSG_UPDATE, mark_reconciling, record_cancelled, record_lost
from pko.controllers.stack.steps import (
    CancelUpdate,
    Emit,
    Log,
    Observed,
    Plan,
    ReadSource,
    Write,
    annotation,
    write_status,
)
from pko.controllers.stack.switch import may_name_stale_artifact
from pko.controllers.stack.watches import update_complete
from pko.machinery.controller import Result
from pko.machinery.resource import Obj

__all__ = ["Absorbed", "absorb", "cancel_requested", "record_ended"]


@dataclass(frozen=True, slots=True)
class Absorbed:
    """No Update runs any more: the Events and log lines that say how the last one ended, and the
    Update whose result the status now holds (released once the status is written)."""

    writes: list[Write]
    recorded: Obj | None = None


def absorb(observed: Observed, stack: Stack, status: Obj) -> Absorbed | Plan | ReadSource:
    """The Update ``status.currentUpdate`` names: gone (a lost one counts as a transient failure
    when its kind says so: the Stack moves on instead of waiting forever, Go issue 1292), still
    running (a plan that waits; the source is read first when the Workspace may name an artifact
    nobody serves, :mod:`pko.controllers.stack.switch`), or ended (its result recorded)."""
    obj, now = observed.obj, observed.now
    meta = obj.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    current = status.get("currentUpdate")
    if not current:
        return Absorbed([])
    update = observed.current_update
    kind = recorded_kind(current, update)
    if update is None:
        fields = {"stack": meta.get("name"), "update": current.get("name")}
        if kind.lost_fails:
            record_lost(status, current, now)
        if kind.holds_plan:
            status.pop("plan", None)
        status.pop("currentUpdate", None)
        return Absorbed([Log("current update is gone; moving on", fields)])
    if not update_complete(update):
        if observed.source is None and may_name_stale_artifact(observed.workspace):
            return ReadSource(stack, git_packs(observed.templates.enforced, stack))
        # An Update whose workspace pod is stranded (its node lost) waits for the agent's
        # unreachable timeout; what a person must do shows meanwhile.
        stranded = mark_workspace_stalled(status, observed.workspace, generation, now)
        if not stranded and not kind.quiet and not current.get("cancelRequest"):
            mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
        return Plan([write_status(status), *unservable_workspace(observed, stack)], Result.done(), status)
    writes = record_ended(status, current, update, observed.outputs, generation, now)
    status.pop("currentUpdate", None)
    return Absorbed(writes, update)


def record_ended(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Write]:
    """Record a completed Update by its kind (a cancelled one as cancelled); the Events, and those
    of the policies it violated and the pending operations it cleared from the state or left there."""
    kind = recorded_kind(current, update)
    record = RECORDERS[kind.records]
    token = current.get("cancelRequest")
    events: list[Write]
    if token:
        if kind.records_cancelled:
            record(status, current, update, outputs, generation, now)  # the cancellation's Event says it
        if kind.holds_plan:
            status.pop("plan", None)
        record_cancelled(status, current, update, str(token), now)
        message = f"Update {current.get('name')} was cancelled on request {token!r}"
        events = [Emit("Warning", "StackUpdateCancelled", message)]
    else:
        if kind.holds_plan:
            status.pop("plan", None)  # spent: a plan applies once; a preview records its own
        events = [*record(status, current, update, outputs, generation, now)]
    return events + policy_violation_events(update) + pending_operation_events(update)


def cancel_requested(observed: Observed, status: Obj, generation: int, writes: list[Write]) -> Plan | None:
    """A new ``pulumi.com/cancel-request`` token: delete the Update in flight (its reconciler
    cancels the operation; the Stack records it as ``Cancelled`` once it ends) and record the
    token. None when there is no new token, or nothing runs (the token is recorded, a
    ``NothingToCancel`` Event appended to ``writes``, and the reconcile goes on)."""
    obj, now = observed.obj, observed.now
    token = annotation(obj, CANCEL_REQUEST_ANNOTATION)
    if not token or token == (obj.get("status") or {}).get("observedCancelRequest"):
        return None
    status["observedCancelRequest"] = token
    current = status.get("currentUpdate") or {}
    update = observed.current_update
    if not current or update is None or update_complete(update) or current.get("cancelRequest"):
        writes.append(
            Emit(
                "Normal",
                "NothingToCancel",
                f"cancel request {token!r}: no operation to cancel (none runs, or it is being cancelled)",
            )
        )
        return None
    name = str(current.get("name") or "")
    status["currentUpdate"] = {**current, "cancelRequest": token}
    message = f"cancelling Update {name} on request {token!r}"
    mark_reconciling(status, "Cancelling", message, generation, now)
    uid = (update.get("metadata") or {}).get("uid")
    cancel: list[Write] = [
        write_status(status),
        Emit("Normal", "Cancelling", message),
        CancelUpdate(name, str(uid) if uid else None),
    ]
    return Plan(cancel, Result.done(), status)
