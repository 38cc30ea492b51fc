"""What one Update reconcile decided: the writes to make, in order, and the ``Result`` (pure).

The reconciler reads (the caches and its own in-memory state: :class:`Observed`), asks
:func:`decide` what to do, and carries out the :class:`Plan` in one place
(``UpdateReconciler._act``), the only code that writes. Where the rest depends on a write's answer
(the operation ``StartOperation`` started or attached to, the status ``CancelOperation`` left),
the plan ends with ``then``: the pure function that plans the rest from that answer. When a write
fails in a way the reconcile expects (the agent unreachable or busy, a stale status write), the
reconciler describes the failure as a :class:`Failure` and :func:`refused` plans the rest; any
other failure propagates (the controller retries with backoff).

Nothing here does I/O: each function is a function of what was read and the time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from pko.api.generated.pko.agent import v1 as pb
from pko.api.meta import parse_go_duration
from pko.api.update import CONDITION_COMPLETE
from pko.controllers.resources import STACK_FINALIZER
from pko.controllers.secretaccess import SECRET_FORBIDDEN_REASON, SecretAccess
from pko.controllers.update import status as us
from pko.machinery.conditions import get_condition, is_true, parse_time
from pko.machinery.controller import Result
from pko.machinery.events import Emit, Log
from pko.machinery.objects import controller_of, has_finalizer
from pko.machinery.resource import Obj
from pko.machinery.store import object_key

__all__ = [
    "RECORD_RETRY",
    "STACK_RECORD_RECHECK",
    "TRANSIENT_REQUEUE",
    "CancelGone",
    "CancelOperation",
    "CreateOutputs",
    "DeleteUpdate",
    "Emit",
    "Failure",
    "Follow",
    "ForgetOutcome",
    "KeepOutcome",
    "Log",
    "Observed",
    "Outcome",
    "Plan",
    "RemoveFinalizer",
    "SelectAndStart",
    "StopFollowing",
    "Write",
    "WriteStatus",
    "decide",
    "key_of",
    "last_update_name",
    "may_create_stack",
    "parse_time",
    "plan_end",
    "plan_record",
    "refused",
    "stack_owner",
    "stack_recorded",
    "uid_of",
    "watch_ended",
]

TRANSIENT_REQUEUE: Final = 5.0  # the Go operator's requeue after a TransientFailure
STACK_RECORD_RECHECK: Final = 60.0  # a fallback: the Stack watch normally wakes a waiting TTL
# An outputs Secret the operator may not create (403) is tried again this often (no RBAC watch).
SECRET_FORBIDDEN_RETRY: Final = 30.0
RECORD_RETRY: Final = 1.0  # a result write refused as stale is tried again this soon

# What an agent that is not pko's says to every call pko makes (its gRPC service has another name):
# the Go operator's agent, still running in a workspace pod after a switch to pko.
FOREIGN_AGENT: Final = (
    "the workspace agent answered UNIMPLEMENTED ({detail}): the pod runs another operator's agent "
    "(the Go Pulumi Kubernetes Operator's, or an older pko's), which does not serve pko's agent API; "
    "the workspace pod rolls to pko's agent"
)
# Agent answers that end a followed operation at once (no unreachable budget): the agent will never
# report it. By gRPC code: the Update's Failed reason and what to tell the user.
_WATCH_ENDS: Final[dict[str, tuple[str, str]]] = {
    "NOT_FOUND": (
        us.REASON_OPERATION_LOST,
        "the workspace agent no longer knows this operation: the workspace pod was replaced or lost "
        "its journal ({detail})",
    ),
    "UNIMPLEMENTED": (
        us.REASON_OPERATION_LOST,
        FOREIGN_AGENT + ", which cannot report the operation this Update ran there (its result is "
        "unknown; check the stack's resources and its history in the Pulumi backend); the Stack runs "
        "its operation again in the new pod",
    ),
}


# --- what a reconcile reads -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an operation ended, waiting to be written: the agent's ``result``, or an end without one
    (``reason``, ``message``)."""

    uid: str
    result: pb.OperationResult | None = None
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    """What one reconcile of ``key`` read: the Update from the cache (None when it is gone, then
    ``last``: the Update as its watch task last saw it, if one ran), its Workspace from the cache,
    the outcome waiting to be written for ``key``, whether the Stack that created the Update has
    recorded it (or is gone), whether a watch task follows this incarnation, the time, and for an
    up with ``spec.plan`` the Update it names (``plan_source``, None when it is not there), and
    the operator's ServiceAccount."""

    key: str
    update: Obj | None
    now: datetime
    last: Obj | None = None
    workspace: Obj | None = None
    outcome: Outcome | None = None
    stack_recorded: bool = True
    watch_running: bool = False
    plan_source: Obj | None = None
    # The operator's ServiceAccount and the role to bind: named when a Secret is refused it.
    access: SecretAccess = field(default_factory=SecretAccess)


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return object_key(meta.get("namespace"), str(meta.get("name", "")))


def uid_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def stack_owner(update: Obj) -> str | None:
    """The name of the Stack that owns ``update``, if a Stack does."""
    for ref in (update.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Stack" and str(ref.get("apiVersion", "")).startswith("pulumi.com/"):
            return str(ref.get("name"))
    return None


def last_update_name(stack: Obj | None) -> str | None:
    """The Update a Stack recorded last (``status.lastUpdate.name``)."""
    if stack is None:
        return None
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    name = last.get("name")
    return str(name) if name else None


def stack_recorded(update: Obj, stack: Obj | None) -> bool:
    """The Stack that created ``update`` (``stack``: None when there is none, or no longer) has
    recorded it."""
    return stack is None or last_update_name(stack) == (update.get("metadata") or {}).get("name")


# --- the writes ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteStatus:
    """Write the Update's status if it changed, preconditioned on the resourceVersion read (a write
    from a stale read gets 409). With ``outcome``, the write records that outcome: 409 keeps it for
    a retry, 404 forgets it."""

    status: Obj
    outcome: Outcome | None = None


@dataclass(frozen=True, slots=True)
class SelectAndStart:
    """Agent: select the stack (creating it only when ``create``), then ``StartOperation``; the
    answer is the operation."""

    stack_name: str
    request: pb.StartOperationRequest
    create: bool = True


@dataclass(frozen=True, slots=True)
class CancelOperation:
    """Agent: ``CancelOperation`` for the Update's operation; the answer is its status."""


@dataclass(frozen=True, slots=True)
class CancelGone:
    """Cancel the operation of an Update that vanished (``last``: as its watch task saw it), best
    effort: its failures are ignored."""

    last: Obj


@dataclass(frozen=True, slots=True)
class Follow:
    """Start the background task that follows the running operation (unless one does)."""


@dataclass(frozen=True, slots=True)
class StopFollowing:
    """Cancel the key's background task (the Update is gone)."""


@dataclass(frozen=True, slots=True)
class KeepOutcome:
    """Hold ``outcome`` as the key's pending outcome (until it is written)."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class ForgetOutcome:
    """Drop the key's pending outcome; with ``uid``, also the engine event sequence logged for
    that operation."""

    uid: str | None = None


@dataclass(frozen=True, slots=True)
class CreateOutputs:
    """Create the outputs Secret of ``outcome``'s result (directly; one that already exists is an
    earlier attempt's). A 404 (the namespace is going) forgets the outcome, as its status write's
    would."""

    secret: Obj
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class RemoveFinalizer:
    """Drop the Stack's finalizer from the (deleting) Update."""


@dataclass(frozen=True, slots=True)
class DeleteUpdate:
    """Delete the Update (preconditioned on its uid, background propagation)."""


Write = (
    WriteStatus
    | SelectAndStart
    | CancelOperation
    | CancelGone
    | Follow
    | StopFollowing
    | KeepOutcome
    | ForgetOutcome
    | CreateOutputs
    | Emit
    | Log
    | RemoveFinalizer
    | DeleteUpdate
)


@dataclass(slots=True)
class Plan:
    """Writes in order, the ``Result``, and ``then``: what to plan, from the answer of the plan's
    agent call (an operation's status) and the time it came, once the writes are carried out."""

    writes: list[Write]
    result: Result
    then: Callable[[pb.OperationStatus, datetime], Plan] | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A write that failed: ``status`` for an API error (its HTTP status), ``code``/``reason``/
    ``message``/``transient`` for the agent's error, ``unreachable`` when the agent has no address
    (``message`` then says why)."""

    status: int | None = None
    code: str = ""
    reason: str = ""
    message: str = ""
    transient: bool = False
    unreachable: bool = False


_DONE: Final = Result.done()


# --- deciding --------------------------------------------------------------------------------------


def decide(observed: Observed) -> Plan:
    """The whole reconcile of one Update, from what was read."""
    update = observed.update
    if update is None:
        # It vanished (deleted without a finalizer): stop following it, cancel its operation.
        last = observed.last
        writes: list[Write] = [ForgetOutcome(uid_of(last) if last is not None else None), StopFollowing()]
        if last is not None:
            writes.append(CancelGone(last))
        return Plan(writes, _DONE)
    now = observed.now
    writes = []
    outcome = observed.outcome
    if outcome is not None:
        if outcome.uid == uid_of(update) and not us.is_complete(update):
            return plan_record(update, outcome, now, keep=False)
        writes.append(ForgetOutcome())  # another incarnation's, or already recorded
    if us.is_complete(update):
        # Its watch task (if any) ends by itself once it sees the Update complete.
        plan = _completed(update, observed.stack_recorded, now)
    else:
        plan = _not_complete(observed, update)
    plan.writes[:0] = writes
    return plan


def _not_complete(observed: Observed, update: Obj) -> Plan:
    now = observed.now
    meta = update.get("metadata") or {}
    ending = bool(meta.get("deletionTimestamp")) or controller_of(update) is None
    if us.is_running(update):
        if ending:
            # Cancel its operation; the watch records how it ends.
            return Plan([CancelOperation()], _DONE, _cancelled(update))
        return Plan([Follow()], _DONE)
    if meta.get("deletionTimestamp"):
        return plan_end(
            update, us.REASON_CANCELED, "the Update was deleted before its operation started", now
        )
    if controller_of(update) is None:
        return plan_end(update, us.REASON_CANCELED, "the Update has no controlling owner (orphaned)", now)
    return _start(update, observed.workspace, now, observed.plan_source)


def _wait(update: Obj, reason: str, message: str, now: datetime, requeue: float | None = None) -> Plan:
    """Record why the Update has not started (only when that changed), then wait."""
    result = Result.requeue_after(requeue) if requeue is not None else _DONE
    return Plan([WriteStatus(us.waiting_status(update, reason, message, now))], result)


def _start(update: Obj, workspace: Obj | None, now: datetime, plan_source: Obj | None = None) -> Plan:
    spec = update.get("spec") or {}
    ws_name = spec.get("workspaceName")
    if workspace is None:
        return _wait(update, us.REASON_WORKSPACE_NOT_FOUND, f"workspace {ws_name!r} not found", now)
    if not is_true((workspace.get("status") or {}).get("conditions"), "Ready"):
        return _wait(update, us.REASON_WORKSPACE_NOT_READY, f"workspace {ws_name!r} is not ready", now)
    plan_id: str | None = None
    if spec.get("type") == "up" and spec.get("plan"):
        # The agent knows plans by the preview's operation id, its uid; a preview that cannot have
        # saved one ends the up as the agent would, PlanNotFound (the Stack previews again).
        problem = us.plan_problem(update, plan_source)
        if problem is not None:
            return plan_end(update, us.REASON_PLAN_NOT_FOUND, problem, now)
        plan_id = uid_of(plan_source) if plan_source is not None else None
    try:
        request = us.operation_request(update, plan_id)
    except ValueError as exc:
        return plan_end(update, us.REASON_UPDATE_FAILED, str(exc), now)
    stack_name = str(spec.get("stackName") or "")
    create = may_create_stack(str(spec.get("type") or ""), workspace, stack_name)

    def then(op: pb.OperationStatus, now: datetime) -> Plan:
        if op.result is not None:
            # Attached to an operation that already finished (its earlier start was not recorded).
            return plan_record(update, Outcome(uid_of(update), result=op.result), now)
        started = Log(
            "update started", {"update": key_of(update), "operation": uid_of(update), "attached": op.attached}
        )
        return Plan([WriteStatus(us.started_status(update, now)), started, Follow()], _DONE)

    return Plan([SelectAndStart(stack_name, request, create)], _DONE, then)


def may_create_stack(update_type: str, workspace: Obj, stack_name: str) -> bool:
    """Whether selecting the stack may create it: only for a preview or an up, and, when the
    Workspace declares the stack, only if it says ``create: true`` (as its own initialization
    does; ``useLocalStackOnly`` says false). A destroy or a refresh needs the state that is there:
    one that created an empty stack would report success having destroyed nothing (the Stack's
    resources left behind)."""
    if update_type not in ("preview", "up"):
        return False
    for entry in (workspace.get("spec") or {}).get("stacks") or []:
        if entry.get("name") == stack_name:
            return entry.get("create") is True
    return True


def _cancelled(update: Obj) -> Callable[[pb.OperationStatus, datetime], Plan]:
    def then(status: pb.OperationStatus, now: datetime) -> Plan:
        if status.result is not None:
            return plan_record(update, Outcome(uid_of(update), result=status.result), now)
        return Plan([Follow()], _DONE)

    return then


def _completed(update: Obj, recorded: bool, now: datetime) -> Plan:
    """A completed Update: drop the Stack's finalizer once it is deleting and recorded; delete it
    after ``ttlAfterCompleted``, never before the Stack recorded it."""
    meta = update.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        if has_finalizer(update, STACK_FINALIZER):
            if not recorded:
                return Plan([], Result.requeue_after(STACK_RECORD_RECHECK))
            return Plan([RemoveFinalizer()], _DONE)
        return Plan([], _DONE)
    ttl_text = (update.get("spec") or {}).get("ttlAfterCompleted")
    if not ttl_text:
        return Plan([], _DONE)
    try:
        ttl = parse_go_duration(str(ttl_text))
    except ValueError:
        return Plan([], _DONE)
    status = update.get("status") or {}
    complete = get_condition(status.get("conditions"), CONDITION_COMPLETE) or {}
    ended = parse_time(status.get("endTime")) or parse_time(complete.get("lastTransitionTime"))
    if ended is None:
        return Plan([], _DONE)
    remaining = (ended + ttl - now).total_seconds()
    if remaining > 0:
        return Plan([], Result.requeue_after(remaining))
    if not recorded:
        return Plan([], Result.requeue_after(STACK_RECORD_RECHECK))
    writes: list[Write] = [
        DeleteUpdate(),
        Log("update expired", {"update": key_of(update), "ttl": str(ttl_text)}),
        Emit("Normal", "UpdateExpired", "ttl expired and was deleted"),
    ]
    return Plan(writes, _DONE)


# --- recording -------------------------------------------------------------------------------------


def plan_record(update: Obj, outcome: Outcome, now: datetime, *, keep: bool = True) -> Plan:
    """Record ``outcome`` (once): held as pending first (``keep``; a pending one already is), the
    outputs Secret, the final status (preconditioned), a log line and an Event; then forgotten."""
    writes: list[Write] = [KeepOutcome(outcome)] if keep else []
    key, uid = key_of(update), uid_of(update)
    result = outcome.result
    if result is not None:
        outputs: str | None = None
        if result.outputs or (
            result.type == pb.OperationType.UP and result.state == pb.OperationState.SUCCEEDED
        ):
            secret = us.outputs_secret(update, result.outputs)
            outputs = str(secret["metadata"]["name"])
            writes.append(CreateOutputs(secret, outcome))
        writes.append(WriteStatus(us.result_status(update, result, outputs, now), outcome))
        utype = (update.get("spec") or {}).get("type") or "update"
        reason = us.failed_reason(result)
        fields: dict[str, Any] = {"update": key, "operation": uid, "type": utype, "reason": reason}
        note = us.removed_lock_note(result)
        if note:
            fields["removedLock"] = note
        if result.state == pb.OperationState.SUCCEEDED:
            writes += [
                Log("update succeeded", fields),
                Emit("Normal", "UpdateSucceeded", f"{utype} succeeded"),
            ]
        else:
            message = us.result_message(result)
            first = message.splitlines()[0] if message else reason
            writes += [
                Log("update failed", {**fields, "message": message}),
                Emit("Warning", "UpdateFailed", f"{utype} failed ({reason}): {first}"),
            ]
        if note:
            # A stale lock of the workspace pod stopped the operation's first attempt: whose, and what
            # the update it interrupted left, whatever the attempt after it did.
            writes.append(Emit("Warning", "StaleLockRemoved", note))
    else:
        reason, message = outcome.reason, outcome.message
        writes += [
            WriteStatus(us.ended_status(update, reason, message, now), outcome),
            Log("update ended", {"update": key, "reason": reason, "message": message}),
            Emit("Warning", "UpdateFailed", f"{reason}: {message}"),
        ]
    writes.append(ForgetOutcome(outcome.uid))
    return Plan(writes, _DONE)


def watch_ended(uid: str, code: str, detail: str) -> Outcome | None:
    """How the operation ``uid`` a watch task follows ends when its agent answers ``code`` (with
    ``detail``); None when the answer leaves it running (tried again within the unreachable budget)."""
    ends = _WATCH_ENDS.get(code)
    if ends is None:
        return None
    reason, message = ends
    return Outcome(uid, reason=reason, message=message.format(detail=detail))


def plan_end(update: Obj, reason: str, message: str, now: datetime) -> Plan:
    """End the Update without a result from the agent (Failed with ``reason``)."""
    return plan_record(update, Outcome(uid_of(update), reason=reason, message=message), now)


# --- expected failures -----------------------------------------------------------------------------


def refused(observed: Observed, write: Write, failure: Failure, now: datetime) -> Plan | None:
    """The rest of the reconcile after ``write`` failed with ``failure`` (at ``now``); None when the
    failure is not one this write expects (it propagates: the controller retries with backoff)."""
    update = observed.update
    if update is None:
        return None
    if isinstance(write, SelectAndStart):
        if failure.unreachable:
            return _wait(update, us.REASON_TRANSIENT_FAILURE, failure.message, now, TRANSIENT_REQUEUE)
        if failure.transient or failure.code in ("ABORTED", "FAILED_PRECONDITION"):
            # Unreachable, or busy with another operation: try again shortly.
            message = f"{failure.reason}: {failure.message}"
            return _wait(update, us.REASON_TRANSIENT_FAILURE, message, now, TRANSIENT_REQUEUE)
        if failure.code == "UNIMPLEMENTED":
            # Not started anywhere: it starts, once, on pko's agent when the pod has rolled.
            message = FOREIGN_AGENT.format(detail=failure.message) + "; the Update starts there"
            return _wait(update, us.REASON_TRANSIENT_FAILURE, message, now, TRANSIENT_REQUEUE)
        if failure.code == "NOT_FOUND":
            # The stack is not in the backend and this operation may not create it.
            return plan_end(update, us.REASON_STACK_NOT_FOUND, failure.message, now)
        return plan_end(update, failure.reason or us.REASON_UPDATE_FAILED, failure.message, now)
    if isinstance(write, CancelOperation):
        if failure.unreachable:
            detail, transient = failure.message, True
        else:
            detail = f"{failure.reason}: {failure.message}"
            transient = failure.transient and failure.code != "NOT_FOUND"
        # While a watch task still follows the operation (it ends it within its budget) try
        # again; otherwise end the Update here.
        if transient and observed.watch_running:
            return Plan([], Result.requeue_after(TRANSIENT_REQUEUE))
        message = f"the Update was canceled; its operation could not be: {detail}"
        return plan_end(update, us.REASON_CANCELED, message, now)
    if isinstance(write, WriteStatus | CreateOutputs) and write.outcome is not None:
        # Recording an outcome: a stale read is tried again from the cache (the outcome is kept);
        # a vanished Update's outcome is forgotten.
        if failure.status == 409 and isinstance(write, WriteStatus):
            return Plan([], Result.requeue_after(RECORD_RETRY))
        if failure.status == 404:
            return Plan([ForgetOutcome(write.outcome.uid)], _DONE)
        if failure.status == 403 and isinstance(write, CreateOutputs):
            # The secrets-per-namespace install, not bound in this namespace: the outcome is kept
            # (held pending) and recorded once the binding lets the Secret be created.
            meta = write.secret.get("metadata") or {}
            message = observed.access.forbidden(meta.get("namespace"), str(meta.get("name")), verb="create")
            emit = Emit("Warning", SECRET_FORBIDDEN_REASON, message)
            log = Log("outputs secret refused", {"update": observed.key, "reason": SECRET_FORBIDDEN_REASON})
            return Plan([emit, log], Result.requeue_after(SECRET_FORBIDDEN_RETRY))
        return None
    if isinstance(write, DeleteUpdate) and failure.status in (404, 409):
        return Plan([], _DONE)  # gone already, or another incarnation: no Event
    return None
