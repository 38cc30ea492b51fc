"""What one Stack reconcile decided: the writes to make, in order, and when to look again (pure).

The reconciler reads (caches, Secrets, the git remote), asks the functions here and in
:mod:`pko.controllers.stack.status` what to do, and carries out a :class:`Plan` in one place
(``StackReconciler._act``), the only code that writes. Where the rest depends on what a write
returned (the Workspace as applied decides whether an Update starts), a plan ends with ``then``:
the pure function that plans the rest from it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pko.api.stack import Stack
from pko.controllers.stack.status import (
    MSG_UPDATE,
    mark_reconciling,
    mark_stalled,
    reconcile_request,
)
from pko.controllers.stack.updateobject import build_update, update_type_for
from pko.controllers.stack.watches import workspace_ready
from pko.machinery.conditions import get_condition
from pko.machinery.controller import Result
from pko.machinery.events import Emit
from pko.machinery.resource import Obj

__all__ = [
    "AddFinalizer",
    "ApplyWorkspace",
    "CreateUpdate",
    "DeleteWorkspace",
    "Emit",
    "Plan",
    "PruneHistory",
    "ReleaseUpdate",
    "RemoveFinalizer",
    "RequestReconcile",
    "Write",
    "WriteStatus",
    "plan_synced",
    "plan_update",
    "write_status",
]


@dataclass(frozen=True, slots=True)
class WriteStatus:
    """Apply the Stack's status (the fields this controller owns; skipped when unchanged), then
    release ``recorded``, the Update whose result it now holds."""

    status: Obj
    recorded: Obj | None = None


@dataclass(frozen=True, slots=True)
class AddFinalizer:
    """Add the Stack's finalizer (before anything is created for it)."""


@dataclass(frozen=True, slots=True)
class RemoveFinalizer:
    """Release the Stack: its deletion goes on (its Workspace and Updates are garbage collected)."""


@dataclass(frozen=True, slots=True)
class ApplyWorkspace:
    """Server-side apply the Stack's Workspace (stamped with its digest; skipped when unchanged)."""

    body: Obj


@dataclass(frozen=True, slots=True)
class CreateUpdate:
    """Create the Update that runs one operation (``status.currentUpdate`` already names it)."""

    body: Obj


@dataclass(frozen=True, slots=True)
class DeleteWorkspace:
    """Delete the Stack's Workspace (reclaim policy ``Delete``), with a ``WorkspaceDeleted`` Event."""


@dataclass(frozen=True, slots=True)
class ReleaseUpdate:
    """Drop the Stack's finalizer from a recorded Update."""

    update: Obj | None


@dataclass(frozen=True, slots=True)
class PruneHistory:
    """Delete completed Updates beyond the history limit, never those named in ``keep``."""

    keep: frozenset[str]


@dataclass(frozen=True, slots=True)
class RequestReconcile:
    """Ask another Stack (a prerequisite) to run again: its reconciliation-request annotation."""

    stack: str
    request: str


Write = (
    WriteStatus
    | AddFinalizer
    | RemoveFinalizer
    | Emit
    | ApplyWorkspace
    | CreateUpdate
    | DeleteWorkspace
    | ReleaseUpdate
    | PruneHistory
    | RequestReconcile
)


@dataclass(slots=True)
class Plan:
    """Writes in order, the ``Result``, the status they leave (a stall found while carrying them out
    is marked on it), and ``then``: what to plan from the Workspace once it is applied."""

    writes: list[Write]
    result: Result
    status: Obj = field(default_factory=dict)
    then: Callable[[Obj], Plan] | None = None


def write_status(status: Obj, recorded: Obj | None = None) -> WriteStatus:
    """A status write of ``status`` as it is now (later decisions may change the dict)."""
    return WriteStatus(copy.deepcopy(status), recorded)


def _after(requeue: float | None) -> Result:
    return Result.requeue_after(requeue) if requeue else Result.done()


def plan_synced(
    stack: Stack, status: Obj, requeue: float | None, recorded: Obj | None, *, deleting: bool
) -> Plan:
    """Nothing to run: report, release a destroyed Stack, reclaim the Workspace, prune history."""
    last = status.get("lastUpdate") or {}
    if deleting:
        if last.get("state") != "succeeded":
            # A failed destroy keeps the finalizer: the stack's resources would be orphaned.
            return Plan([write_status(status, recorded)], _after(requeue), status)
        return Plan([write_status(status, recorded), RemoveFinalizer()], Result.done(), status)
    writes: list[Write] = []
    if last.get("state") == "succeeded" and stack.spec.workspace_reclaim_policy == "Delete":
        writes += [ReleaseUpdate(recorded), DeleteWorkspace()]
        recorded = None
    keep = {(status.get("currentUpdate") or {}).get("name"), last.get("name")}
    writes += [write_status(status, recorded), PruneHistory(frozenset(str(k) for k in keep if k))]
    return Plan(writes, _after(requeue), status)


def plan_update(
    obj: Obj,
    stack: Stack,
    status: Obj,
    workspace: Obj,
    *,
    message: str,
    commit: str,
    now: datetime,
    created: datetime,
    deleting: bool,
) -> Plan:
    """The Workspace is applied: start one Update once it is ready, or report why it cannot be.
    ``created`` names the Update (milliseconds: two Updates of one Stack may start in a second)."""
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    if not workspace_ready(workspace):
        stalled = get_condition((workspace.get("status") or {}).get("conditions"), "Stalled")
        if stalled is None or stalled.get("status") != "True":
            return Plan([], Result.done(), status)  # its next status change wakes us
        if deleting and not status.get("lastUpdate"):
            return Plan([RemoveFinalizer()], Result.done(), status)  # never ran: nothing to destroy
        ws_reason = str(stalled.get("reason") or "")
        reason = "PulumiVersionTooLow" if ws_reason == "IncompatibleConfiguration" else "WorkspaceFailed"
        mark_stalled(status, reason, f"{ws_reason}: {stalled.get('message', '')}", generation, now)
        return Plan([write_status(status)], Result.done(), status)
    update = build_update(stack, workspace, update_type_for(stack, deleting=deleting), message, now=created)
    status["currentUpdate"] = {
        "generation": generation,
        "reconcileRequest": reconcile_request(obj),
        "name": update["metadata"]["name"],
        "commit": commit,
    }
    mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
    writes: list[Write] = [
        write_status(status),
        Emit("Normal", "StackUpdateDetected", message),
        CreateUpdate(update),
    ]
    return Plan(writes, Result.done(), status)
