"""What one Stack reconcile decides: the writes to make, in order, and when to look again (pure).

The reconciler reads (:class:`Observed`: the caches, and before deciding the few reads no cache
holds: the Update in flight when the cache lacks it, its outputs Secret), asks :func:`decide` what
to do, and carries out the :class:`Plan` in one place (``StackReconciler._act``), the only code
that writes. A read only some decisions need (the source with its Secrets and branch head) is
asked for as data (:class:`ReadSource`): the reconciler reads, and :func:`decide` runs again with
the answer. A Stack that cannot be processed as
written is a planned ``Stalled`` status, not an exception. Where the rest depends on what a write
returned (the Workspace as applied decides whether an Update starts), a plan ends with ``then``:
the pure function that plans the rest from it. When a write fails in a way the reconcile expects
(a namespace being deleted, an Update that could not be created), the reconciler describes the
failure as a :class:`Failure` and :func:`refused` plans the rest.

Nothing here does I/O: each function is a function of what was read and the time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final

from pko.api.meta import parse_go_duration
from pko.api.stack import DriftDetectionSpec, Stack
from pko.api.validation import deprecation_warnings, format_errors, parse_stack
from pko.controllers.resources import (
    APPROVED_PLAN_ANNOTATION,
    CANCEL_REQUEST_ANNOTATION,
    STACK_FINALIZER,
)
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.approval import (
    PLAN_INPUTS_ANNOTATION,
    Apply,
    Preview,
    gate,
    mark_awaiting_approval,
    plan_inputs,
    record_plan,
)
from pko.controllers.stack.backend import EPHEMERAL_BACKEND_REASON, ephemeral_backend
from pko.controllers.stack.drift import (
    clear_drift,
    drift_due_in,
    record_drift,
    record_drift_failure,
    remediation_due,
)
from pko.controllers.stack.guidance import destroy_from_project_message, release_command
from pko.controllers.stack.refresh import (
    RefreshWait,
    record_refresh,
    requested_refresh,
    retrying_message,
)
from pko.controllers.stack.status import (
    MSG_UPDATE,
    MSG_WORKSPACE,
    StackRef,
    destroyed_nothing,
    mark_ephemeral_backend,
    mark_ready,
    mark_reconciling,
    mark_result,
    mark_stalled,
    mark_suspended,
    plan_sync,
    reconcile_request,
    record_cancelled,
    record_destroyed_nothing,
    record_failed,
    record_lost,
    record_succeeded,
    requirement_error,
)
from pko.controllers.stack.switch import may_name_stale_artifact, stale_artifact
from pko.controllers.stack.updateobject import Run, build_update, kind_of, update_type_for
from pko.controllers.stack.watches import update_complete, workspace_ready, workspace_stalled
from pko.controllers.stack.workspaceobject import ProjectInfoRevision, ResolvedSource, build_workspace
from pko.machinery.conditions import get_condition, is_true
from pko.machinery.controller import Result
from pko.machinery.events import Emit, Log
from pko.machinery.objects import has_finalizer
from pko.machinery.resource import Obj
from pko.machinery.writes import stamp

__all__ = [
    "DEPRECATED_FIELD_REASON",
    "SOURCE_UNAVAILABLE_REQUEUE",
    "AddFinalizer",
    "ApplyWorkspace",
    "CancelUpdate",
    "CreateUpdate",
    "DeleteWorkspace",
    "Emit",
    "Failure",
    "Log",
    "Observed",
    "Plan",
    "PruneHistory",
    "ReadSource",
    "ReleaseUpdate",
    "RemoveFinalizer",
    "RequestReconcile",
    "Resolved",
    "Settings",
    "Unresolved",
    "Write",
    "WriteStatus",
    "decide",
    "plan_synced",
    "plan_update",
    "prerequisites_unmet",
    "record_update",
    "refused",
    "saved_project",
    "stack_ref",
    "terminating_message",
    "unservable_workspace",
    "workspace_body",
    "workspace_for_destroy",
    "write_status",
]

DEPRECATED_FIELD_REASON: Final = "DeprecatedField"  # a pko Event: upstream only documents the deprecations
# A source that cannot be had (a Flux object or Program missing, a branch lookup refused) is looked
# at again this often; so is a destroy that a terminating namespace blocks.
SOURCE_UNAVAILABLE_REQUEUE: Final = 30.0


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
class CancelUpdate:
    """Delete the running Update ``name`` (``uid``): the Update reconciler cancels its operation
    (the Stack's finalizer keeps the Update until the Stack has recorded how it ended)."""

    name: str
    uid: str | None


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


@dataclass(frozen=True, slots=True)
class ReadSource:
    """Read the Stack's source at its current revision (its Secrets, a branch head, a Flux object's
    or Program's artifact): a read only some decisions need. Answer: :class:`Resolved` or
    :class:`Unresolved`; ``then`` decides again with it."""

    stack: Stack


Write = (
    WriteStatus
    | ReadSource
    | Log
    | AddFinalizer
    | RemoveFinalizer
    | Emit
    | ApplyWorkspace
    | CreateUpdate
    | CancelUpdate
    | DeleteWorkspace
    | ReleaseUpdate
    | PruneHistory
    | RequestReconcile
)


@dataclass(slots=True)
class Plan:
    """Writes in order, the ``Result``, the status they leave (a stall found while carrying them out
    is marked on it), and ``then``: what to plan from the last write's answer (the Workspace as
    applied; the source, read)."""

    writes: list[Write]
    result: Result
    status: Obj = field(default_factory=dict)
    then: Callable[[Any], Plan] | None = None


def write_status(status: Obj, recorded: Obj | None = None) -> WriteStatus:
    """A status write of ``status`` as it is now (later decisions may change the dict)."""
    return WriteStatus(copy.deepcopy(status), recorded)


def _after(requeue: float | None) -> Result:
    return Result.requeue_after(requeue) if requeue else Result.done()


def _sooner(requeue: float | None, waiting: RefreshWait | float | None) -> float | None:
    """``requeue``, or sooner when something else is due then: a refresh request's retry (a Stack
    waiting for something else, an approval or a prerequisite, still runs it on time), a drift check."""
    other = waiting.after if isinstance(waiting, RefreshWait) else waiting
    if other is None:
        return requeue
    return min(requeue, other) if requeue is not None else other


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
    keep = {
        (status.get("currentUpdate") or {}).get("name"),
        last.get("name"),
        (status.get("lastRefresh") or {}).get("name"),
    }
    writes += [write_status(status, recorded), PruneHistory(frozenset(str(k) for k in keep if k))]
    return Plan(writes, _after(requeue), status)


def mark_workspace_stalled(status: Obj, workspace: Obj | None, generation: int, now: datetime) -> bool:
    """Mark the Stack Stalled for its Workspace's Stalled condition (a pod on a lost node, a Pulumi
    too old for the spec): only a person can help, and the Stack is where they look. False when the
    Workspace is not Stalled."""
    stalled = get_condition(((workspace or {}).get("status") or {}).get("conditions"), "Stalled")
    if workspace_ready(workspace) or stalled is None or stalled.get("status") != "True":
        return False
    ws_reason = str(stalled.get("reason") or "")
    reason = "PulumiVersionTooLow" if ws_reason == "IncompatibleConfiguration" else "WorkspaceFailed"
    mark_stalled(status, reason, f"{ws_reason}: {stalled.get('message', '')}", generation, now)
    return True


def plan_update(
    obj: Obj,
    stack: Stack,
    status: Obj,
    workspace: Obj,
    *,
    run: Run,
    commit: str,
    now: datetime,
    created: datetime,
    deleting: bool,
) -> Plan:
    """The Workspace is applied: start the Update ``run`` describes once it is ready, or report why
    it cannot be. ``created`` names the Update (milliseconds: two Updates of one Stack may start in
    a second). A drift check leaves the conditions alone (a periodic read must not flap Ready)."""
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    if not workspace_ready(workspace):
        if not mark_workspace_stalled(status, workspace, generation, now):
            return Plan([], Result.done(), status)  # its next status change wakes us
        if deleting and not status.get("lastUpdate"):
            return Plan([RemoveFinalizer()], Result.done(), status)  # never ran: nothing to destroy
        return Plan([write_status(status)], Result.done(), status)
    update = build_update(stack, workspace, run.type, run.message, now=created, run=run)
    status["currentUpdate"] = {
        "generation": generation,
        "reconcileRequest": reconcile_request(obj),
        "name": update["metadata"]["name"],
        "commit": commit,
    }
    if run.kind != "sync":
        status["currentUpdate"]["kind"] = run.kind
    if run.kind == "drift":
        fields = {"stack": (obj.get("metadata") or {}).get("name"), "update": update["metadata"]["name"]}
        said: Write = Log("drift check started", fields)
    else:
        mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
        said = Emit("Normal", "StackUpdateDetected", run.message)
    writes: list[Write] = [write_status(status), said, CreateUpdate(update)]
    return Plan(writes, Result.done(), status)


# --- what a reconcile reads ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolved:
    """The source at a revision (``source`` None: the workspace template brings the program);
    ``served``: its artifact is the one its server serves now (:func:`artifact_served`)."""

    source: ResolvedSource | None
    commit: str
    served: bool = False


@dataclass(frozen=True, slots=True)
class Unresolved:
    """The source could not be had: ``reason`` and ``message`` are a Stalled reason and message,
    looked at again after ``requeue`` seconds (None: when something changes)."""

    reason: str
    message: str
    requeue: float | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    """What one Stack reconcile read: the Stack (``obj``, from the cache), the Update its
    ``status.currentUpdate`` names (None when that is gone, or none is named), the outputs of that
    Update when it completed (None: it has none, or its Secret is gone), the Stack's Workspace and
    the Stacks it names as prerequisites (the cache), its source (None when it was not needed), and
    the time (``now`` to the second for status times, ``created`` precise, naming an Update)."""

    obj: Obj
    now: datetime
    created: datetime
    settings: Settings
    current_update: Obj | None = None
    outputs: Obj | None = None
    workspace: Obj | None = None
    prerequisites: Mapping[str, Obj | None] = field(default_factory=dict)
    source: Resolved | Unresolved | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The operator's settings a decision uses: the retry rules and the default workspace image by
    security profile."""

    retry: RetrySettings
    workspace_image: Callable[[str | None], str]
    owned_status: tuple[str, ...] = ()


def read_source(observed: Observed, stack: Stack) -> Plan:
    """Read the source first, then decide again with it: only the decisions that use it ask (not
    an invalid Stack, an Update in flight whose Workspace cannot name an unserved artifact, a
    deletion without a destroy, a destroy in the Workspace as it is). Nothing is written before
    the read: deciding again plans every write."""
    return Plan([ReadSource(stack)], Result.done(), then=lambda got: decide(replace(observed, source=got)))


def unservable_workspace(observed: Observed, stack: Stack) -> list[Write]:
    """The Workspace rewritten under the Update in flight when it names an artifact digest nobody
    serves and the source's served one is known (:mod:`pko.controllers.stack.switch`); else nothing."""
    got = observed.source
    if not isinstance(got, Resolved) or not stale_artifact(observed.workspace, got.source, served=got.served):
        return []
    deleting = bool((observed.obj.get("metadata") or {}).get("deletionTimestamp"))
    try:
        body = workspace_body(stack, got.source, observed.settings.workspace_image, deleting=deleting)
    except ValueError:
        return []  # the Stack's own reconcile reports it once the Update ends
    flux = ((observed.workspace or {}).get("spec") or {}).get("flux") or {}
    fields = {
        "stack": (observed.obj.get("metadata") or {}).get("name"),
        "stale": flux.get("digest"),
        "served": got.commit,
    }
    said = Log(
        "workspace names an artifact digest that is not served; rewritten under the running update", fields
    )
    return [said, ApplyWorkspace(body)]


def workspace_for_destroy(workspace: Obj | None) -> Obj | None:
    """The Workspace a destroy runs in as it is: the one that exists, unless it is Stalled (its pod
    cannot serve; rebuilt from the source, or from ``projectInfo`` when the source is gone) or going
    away. Not Ready yet: the destroy waits for it (its status change wakes the Stack)."""
    if workspace is None or (workspace.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if workspace_stalled(workspace) and not workspace_ready(workspace):
        return None
    return workspace


# --- deciding --------------------------------------------------------------------------------


def decide(observed: Observed) -> Plan:
    """The whole reconcile of one Stack, from what was read (the Go operator's
    ``StackReconciler.Reconcile``; see the reconciler's module docstring)."""
    obj = observed.obj
    meta = obj.get("metadata") or {}
    deleting = bool(meta.get("deletionTimestamp"))
    if deleting and not has_finalizer(obj, STACK_FINALIZER):
        return Plan([], Result.done())
    writes: list[Write] = []
    if not deleting and not has_finalizer(obj, STACK_FINALIZER):
        writes.append(AddFinalizer())
    now = observed.now
    generation = int(meta.get("generation") or 0)
    owned = observed.settings.owned_status
    status: Obj = {k: v for k, v in (obj.get("status") or {}).items() if k in owned}
    status["observedGeneration"] = generation
    status["observedReconcileRequest"] = reconcile_request(obj)
    stack, errors = parse_stack(obj)
    if stack is None or errors:
        if deleting and not (obj.get("status") or {}).get("lastUpdate"):
            return Plan([*writes, RemoveFinalizer()], Result.done(), status)
        message = format_errors(errors)
        mark_stalled(status, "SpecInvalid", message, generation, now)
        writes += [Emit("Warning", "StackConfigInvalid", message), write_status(status)]
        return Plan(writes, Result.done(), status)
    ephemeral = ephemeral_backend(stack)
    mark_ephemeral_backend(status, ephemeral, generation, now)
    if int((obj.get("status") or {}).get("observedGeneration") or 0) != generation:
        # Once per generation (the recorder folds repeats of a retried reconcile into one Event).
        writes += [Emit("Warning", DEPRECATED_FIELD_REASON, w) for w in deprecation_warnings(stack.spec)]
        if ephemeral is not None and not deleting:
            writes.append(Emit("Warning", EPHEMERAL_BACKEND_REASON, ephemeral))
    return _decide_stack(observed, stack, status, writes)


def _annotation(obj: Obj, name: str) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(name) or "")


def _decide_stack(observed: Observed, stack: Stack, status: Obj, writes: list[Write]) -> Plan:
    obj, now = observed.obj, observed.now
    meta = obj.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    deleting = bool(meta.get("deletionTimestamp"))
    spec = stack.spec
    recorded: Obj | None = None

    # 0. a cancel request: the Update in flight is deleted (its reconciler cancels the operation)
    cancelling = cancel_requested(observed, status, generation, writes)
    if cancelling is not None:
        return Plan([*writes, *cancelling.writes], cancelling.result, status)

    # 1. absorb the result of the Update in flight
    current = status.get("currentUpdate")
    if current:
        update = observed.current_update
        if update is None:
            fields = {"stack": meta.get("name"), "update": current.get("name")}
            writes.append(Log("current update is gone; moving on", fields))
            if current.get("kind") in (None, "apply"):
                record_lost(status, current, now)
            if current.get("kind") in ("plan", "apply"):
                status.pop("plan", None)
            status.pop("currentUpdate", None)
        elif not update_complete(update):
            # An Update whose workspace pod is stranded (its node lost) waits for the agent's
            # unreachable timeout; what a person must do shows meanwhile.
            stranded = mark_workspace_stalled(status, observed.workspace, generation, now)
            if not stranded and current.get("kind") != "drift" and not current.get("cancelRequest"):
                mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
            if observed.source is None and may_name_stale_artifact(observed.workspace):
                return read_source(observed, stack)
            writes.append(write_status(status))
            return Plan([*writes, *unservable_workspace(observed, stack)], Result.done(), status)
        else:
            writes += absorb(status, current, update, observed.outputs, generation, now)
            status.pop("currentUpdate", None)
            recorded = update

    # nothing to destroy: release the Stack (its Workspace and Updates go with it)
    if deleting and (not spec.destroy_on_finalize or spec.preview):
        mark_ready(status, generation, now)
        return Plan([*writes, write_status(status, recorded), RemoveFinalizer()], Result.done(), status)

    # 2. the source, pinned to a revision; a destroy runs in the workspace pod that holds the
    # stack whenever there is one (never changed for the destroy's sake: a pod replaced loses
    # state kept on its own disk)
    kept = workspace_for_destroy(observed.workspace) if deleting else None
    source: ResolvedSource | None = None
    note: str | None = None
    if kept is not None:
        commit = str((status.get("lastUpdate") or {}).get("lastAttemptedCommit") or "")
    else:
        got = observed.source
        if got is None:
            return read_source(observed, stack)
        if isinstance(got, Unresolved):
            saved = saved_project(stack, status) if deleting else None
            if saved is None:
                mark_stalled(status, got.reason, got.message, generation, now)
                return Plan([*writes, write_status(status, recorded)], _after(got.requeue), status)
            source, commit, note = saved, "", destroy_from_project_message(got.message, saved)
        else:
            source, commit = got.source, got.commit

    # 3. run, or report and wait
    retry = observed.settings.retry
    polls_branch = bool(spec.project_repo and spec.branch)
    decision = plan_sync(obj, spec, status, commit, now, retry, polls_branch=polls_branch)
    mark_suspended(status, spec.suspend and not deleting, generation, now)
    drift_spec = spec.drift_detection if not spec.preview else None
    if drift_spec is None and (status.get("drift") or get_condition(status.get("conditions"), "Drifted")):
        clear_drift(status)
    gated = spec.approval is not None and spec.approval.mode != "Never"
    if not deleting and not gated and status.get("plan"):
        status.pop("plan", None)  # approval switched off: the plan waits for nothing
    active = not deleting and not spec.suspend
    requested = requested_refresh(obj, spec, status, retry, now) if active else None
    run = requested if isinstance(requested, Run) else None
    # a refresh request waiting to be retried: nothing refreshes before then (a drift check neither)
    waiting = requested if isinstance(requested, RefreshWait) else None
    remediate = active and run is None and remediation_due(drift_spec, status)
    if decision.synced:
        retrying = retrying_message(waiting) if waiting is not None else None
        mark_result(status, spec, retry, generation, now, stack=stack_ref(obj), retrying=retrying)
        if (status.get("lastUpdate") or {}).get("state") != "succeeded":
            # a retry waiting on a Workspace only a person can help (its node lost) says so meanwhile
            mark_workspace_stalled(status, observed.workspace, generation, now)
        mark_suspended(status, spec.suspend and not deleting, generation, now)
    if run is None and decision.synced and not remediate:
        status.pop("plan", None)  # nothing to apply: a recorded plan is moot
        due = drift_due_in(drift_spec, status, now) if active and waiting is None else None
        if due == 0:
            run = Run("refresh", "Drift check", "drift")
        else:
            requeue = _sooner(_sooner(decision.requeue_after, due), waiting)
            plan = plan_synced(stack, status, requeue, recorded, deleting=deleting)
            return Plan([*writes, *plan.writes], plan.result, status)
    if run is None and spec.suspend and not deleting:
        return Plan([*writes, write_status(status, recorded)], Result.done(), status)
    if run is None:
        refresh = remediation_up(drift_spec, status)
        message = "Drift detected: remediating" if decision.synced else decision.message
        chosen = gated_run(obj, stack, status, commit, message, refresh=refresh, deleting=deleting)
        if isinstance(chosen, str):
            mark_awaiting_approval(status, chosen, generation, now)
            plan_now = status.get("plan") or {}
            if observed_plan_recorded(writes, plan_now):
                writes.append(Emit("Normal", "AwaitingApproval", chosen))
            wait = float(spec.resync_frequency()) if polls_branch else None
            return Plan([*writes, write_status(status, recorded)], _after(_sooner(wait, waiting)), status)
        run = chosen

    # 4. prerequisites (not when deleting: a missing prerequisite must not block deletion; not for
    # a refresh or a drift check, which change nothing the program deploys)
    if not deleting and run.kind not in ("refresh", "drift"):
        unmet, requests = prerequisites_unmet(obj, stack, observed.prerequisites, now)
        writes += requests
        if unmet is not None:
            mark_reconciling(status, "PrerequisiteNotSatisfied", unmet, generation, now)
            return Plan([*writes, write_status(status, recorded)], _after(_sooner(None, waiting)), status)

    # 5. the Workspace, then (once it is ready) 6. one Update
    def then(workspace: Obj) -> Plan:
        return plan_update(
            obj,
            stack,
            status,
            workspace,
            run=run,
            commit=commit,
            now=now,
            created=observed.created,
            deleting=deleting,
        )

    if run.kind != "drift":
        mark_reconciling(status, "StackProcessing", note or MSG_WORKSPACE, generation, now)
    if note is not None:
        writes.append(Emit("Warning", "DestroyFromProjectInfo", note))
    if kept is not None:
        writes.append(write_status(status, recorded))
        plan = then(kept)
        return Plan([*writes, *plan.writes], plan.result, status)
    try:
        body = workspace_body(stack, source, observed.settings.workspace_image, deleting=deleting)
    except ValueError as exc:
        mark_stalled(status, "SpecInvalid", str(exc), generation, now)
        return Plan([*writes, write_status(status, recorded)], Result.done(), status)
    writes += [write_status(status, recorded), ApplyWorkspace(body)]
    return Plan(writes, Result.done(), status, then)


# --- the issue-29 operations: cancel, refresh on request, approval, drift --------------------


def cancel_requested(observed: Observed, status: Obj, generation: int, writes: list[Write]) -> Plan | None:
    """A new ``pulumi.com/cancel-request`` token: delete the Update in flight (its reconciler
    cancels the operation; the Stack records it as ``Cancelled`` once it ends) and record the
    token. None when there is no new token, or nothing runs (the token is recorded, a
    ``NothingToCancel`` Event appended to ``writes``, and the reconcile goes on)."""
    obj, now = observed.obj, observed.now
    token = _annotation(obj, CANCEL_REQUEST_ANNOTATION)
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


def remediation_up(drift_spec: DriftDetectionSpec | None, status: Obj) -> bool:
    """Whether ups refresh first to put drift right (``remediate`` and drift found)."""
    remediate = drift_spec is not None and drift_spec.remediate
    return remediate and bool((status.get("drift") or {}).get("detected"))


def gated_run(
    obj: Obj, stack: Stack, status: Obj, commit: str, message: str, *, refresh: bool, deleting: bool
) -> Run | str:
    """The Update an operation that is due runs as, through the approval gate for an up; a str is
    why it waits for approval (the condition's message)."""
    type_ = update_type_for(stack, deleting=deleting)
    mode = stack.spec.approval.mode if stack.spec.approval is not None else "Never"
    effective_refresh = stack.spec.refresh or refresh
    if type_ != "up" or mode == "Never":
        return Run(type_, message, "sync", refresh=True if refresh and type_ != "destroy" else None)
    meta = obj.get("metadata") or {}
    inputs = plan_inputs(obj.get("spec") or {}, commit, refresh=effective_refresh)
    chosen = gate(
        mode,
        status.get("plan"),
        _annotation(obj, APPROVED_PLAN_ANNOTATION),
        inputs,
        str(meta.get("name") or ""),
        str(meta.get("namespace") or ""),
    )
    if isinstance(chosen, Preview):
        status.pop("plan", None)
        annotations = {PLAN_INPUTS_ANNOTATION: inputs}
        return Run("preview", chosen.message, "plan", refresh=effective_refresh, annotations=annotations)
    if isinstance(chosen, Apply):
        return Run("up", chosen.message, "apply", refresh=effective_refresh, plan=chosen.plan)
    return chosen.message


def observed_plan_recorded(writes: list[Write], plan: Obj) -> bool:
    """Whether this reconcile recorded ``plan`` (its Event goes out once, with the plan)."""
    return bool(plan) and any(isinstance(w, Emit) and w.reason == "PlanRecorded" for w in writes)


_PLAN_GONE: Final = frozenset({"PlanMismatch", "PlanNotFound"})


def absorb(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Write]:
    """Record a completed Update by what it was for (``currentUpdate.kind``); the Events, and those
    of the pending operations it cleared from the state or left there."""
    return _absorb(status, current, update, outputs, generation, now) + pending_operation_events(update)


def pending_operation_events(update: Obj) -> list[Write]:
    """The Stack's word on the pending operations an interrupted update left in the state: the
    agent clears a pending create once it is stale (a later update made the resource again), but
    what the interrupted attempt created may still exist outside Pulumi; pending operations that
    remain after a success need a person."""
    upd_status = update.get("status") or {}
    cleared = [str(op.get("urn") or "") for op in upd_status.get("clearedPendingOperations") or []]
    events: list[Write] = []
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


def _absorb(
    status: Obj, current: Obj, update: Obj, outputs: Obj | None, generation: int, now: datetime
) -> list[Write]:
    kind = current.get("kind") or kind_of(update)
    upd_status = update.get("status") or {}
    failed = is_true(upd_status.get("conditions"), "Failed")
    token = current.get("cancelRequest")
    refreshed = record_refresh(status, update, now, cancel_request=token) if kind == "refresh" else []
    if token:
        if kind in ("plan", "apply"):
            status.pop("plan", None)
        record_cancelled(status, current, update, str(token), now)
        message = f"Update {current.get('name')} was cancelled on request {token!r}"
        return [Emit("Warning", "StackUpdateCancelled", message)]
    if kind == "plan":
        if failed:
            status.pop("plan", None)
            return record_update(status, current, update, outputs, now)
        plan = record_plan(status, update, now, str(current.get("commit") or ""))
        summary = plan["summary"]
        text = ", ".join(f"{summary[k]} to {k}" for k in ("create", "update", "delete", "replace"))
        return [Emit("Normal", "PlanRecorded", f"plan {plan['digest']} recorded: {text}")]
    if kind == "apply":
        status.pop("plan", None)  # applied or not, a plan is used once
        reason = (get_condition(upd_status.get("conditions"), "Failed") or {}).get("reason")
        if failed and reason in _PLAN_GONE:
            message = f"the plan could not be applied ({reason}): previewing again for a new approval"
            return [Emit("Warning", "PlanOutdated", f"{message}: {upd_status.get('message') or ''}")]
        return record_update(status, current, update, outputs, now)
    if kind == "refresh":
        return [*refreshed]
    if kind == "drift":
        if failed:
            return [record_drift_failure(status, update, now)]
        return list(record_drift(status, update, generation, now).events)
    return record_update(status, current, update, outputs, now)


def record_update(status: Obj, current: Obj, update: Obj, outputs: Obj | None, now: datetime) -> list[Write]:
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


def prerequisites_unmet(
    obj: Obj, stack: Stack, others: Mapping[str, Obj | None], now: datetime
) -> tuple[str | None, list[Write]]:
    """None when every prerequisite (``others``: the Stacks by name, None when missing) is
    satisfied, else the message (Go's wording); and the prerequisites to ask to run again."""
    failed: list[str] = []
    message: str | None = None
    requests: list[Write] = []
    for prereq in stack.spec.prerequisites or []:
        other = others.get(prereq.name)
        if other is None:
            failed.append(prereq.name)
            missing = f'stacks.pulumi.com "{prereq.name}" not found'
            message = f'unable to fetch prerequisite "{prereq.name}": {missing}'
            continue
        within_text = prereq.requirement.succeeded_within_duration if prereq.requirement else None
        within: timedelta | None = parse_go_duration(within_text) if within_text else None
        error = requirement_error(other, within, now)
        if error is None:
            continue
        failed.append(prereq.name)
        message = f'prerequisite not satisfied for "{prereq.name}": {error.message}'
        if error.touch and reconcile_request(other) != error.touch:
            requests.append(RequestReconcile(prereq.name, error.touch))
    if len(failed) > 1:
        message = f"multiple prerequisites were not satisfied {', '.join(failed)}"
    return message, requests


def workspace_body(
    stack: Stack,
    source: ResolvedSource | None,
    workspace_image: Callable[[str | None], str],
    *,
    deleting: bool,
) -> Obj:
    """The Workspace to apply, stamped with its digest; ValueError for a reference the Go operator
    refuses."""
    body = build_workspace(stack, source, deleting=deleting)
    spec = body["spec"]
    if not spec.get("image"):
        # Named on the Workspace (as upstream's workspaces show it): `kubectl get workspace`
        # then says which image runs, and a new operator default rolls the pod visibly.
        spec["image"] = workspace_image(spec.get("securityProfile"))
    return stamp(body)


def saved_project(stack: Stack, status: Obj) -> ProjectInfoRevision | None:
    """The project a destroy can run from when the source is gone: ``status.projectInfo`` (Go v2.8),
    a minimal Pulumi.yaml in a new workspace pod. None when there is none, or when the destroy
    must run the program (``runProgram``), which a bare project cannot."""
    info = status.get("projectInfo") or {}
    if stack.spec.run_program or not info.get("name"):
        return None
    return ProjectInfoRevision(str(info["name"]), str(info.get("runtime") or ""))


def stack_ref(obj: Obj) -> StackRef:
    meta = obj.get("metadata") or {}
    return StackRef(str(meta.get("name") or ""), str(meta.get("namespace") or ""))


# --- expected failures -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    """A write that failed: the API's HTTP ``status`` and its ``message`` (the response body)."""

    status: int | None
    message: str


def refused(observed: Observed, plan: Plan, write: Write, failure: Failure) -> Plan | None:
    """The rest of the reconcile after ``write`` of ``plan`` failed; None when the failure is not
    one this write expects (it propagates: the controller retries with backoff)."""
    obj = observed.obj
    status = copy.deepcopy(plan.status)
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    if isinstance(write, ApplyWorkspace):
        deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        if deleting and _namespace_terminating(failure.message):
            message = terminating_message(obj, status)
            mark_stalled(status, "NamespaceTerminating", message, generation, observed.now)
            return Plan([write_status(status)], Result.requeue_after(SOURCE_UNAVAILABLE_REQUEUE), status)
        return None
    if isinstance(write, CreateUpdate) and failure.status != 409:
        # Not created: ``currentUpdate`` must not name it (the next reconcile starts one), and the
        # next reconcile comes with the rate limiter's backoff. (409: it exists, so it is ours.)
        status.pop("currentUpdate", None)
        meta = obj.get("metadata") or {}
        fields = {"stack": f"{meta.get('namespace')}/{meta.get('name')}", "status": failure.status}
        said = Log(
            "the Update could not be created; retried with backoff", {**fields, "error": failure.message}
        )
        return Plan([said, write_status(status)], Result.requeue(), status)
    return None


def _namespace_terminating(body: str) -> bool:
    return "NamespaceTerminating" in body or "being terminated" in body


def terminating_message(obj: Obj, status: Obj) -> str:
    """Why a destroy cannot run in a namespace being deleted, and how to release the Stack."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    detail = (status.get("lastUpdate") or {}).get("permalink") or "the Pulumi backend"
    return (
        f'namespace "{namespace}" is terminating, so a workspace cannot be created to run destroy; cloud '
        f"resources will NOT be deleted and must be cleaned up manually (see {detail}). The finalizer is "
        "retained to avoid silently orphaning resources. Once the resources are handled, release the Stack "
        f"with: {release_command(stack_ref(obj))}"
    )
