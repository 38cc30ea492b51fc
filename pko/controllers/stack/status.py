"""What a Stack's status says, and what the Stack reconciler does next (pure, no I/O).

The status is the wire-format dict the reconciler applies to ``/status``. The rules are the Go
operator's (``isSynced``, ``markStackResult``, ``markStackFailed``/``Succeeded``,
``isRequirementSatisfied``, the ``Mark*Condition`` helpers of ``stack_types.go``), with the
changes the issue asks for:

* the failures counter also resets when the source revision changes (any spec, source or config
  change resets the backoff), not only on a new generation or reconcile request;
* retries are classified (:mod:`pko.controllers.stack.retry`): transient failures retry quickly and never
  Stall; deterministic ones use the Go cooldown and Stall after the failure budget;
* ``status.nextRetryTime`` says when a failed operation is retried, ``status.lastFailure`` why it
  failed (both extensions);
* conditions carry ``observedGeneration``.

Exclusivity (as Go): Reconciling and Stalled never appear together; Ready=True removes both.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pko.api.stack import StackSpec
from pko.api.stackterms import POLICY_VIOLATION
from pko.controllers.resources import RECONCILIATION_REQUEST_ANNOTATION, SECRETS_ANNOTATION
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.branchpoll import next_poll
from pko.controllers.stack.guidance import StackRef, stack_not_found_message
from pko.controllers.stack.retry import (
    STALL_AT_ONCE,
    classify_failure,
    failure_budget,
    retry_at,
    retry_delay,
    tail_lines,
)
from pko.machinery.conditions import (
    format_time,
    get_condition,
    is_true,
    parse_time,
    remove_condition,
    set_condition,
)

__all__ = [
    "MSG_IN_PROGRESS",
    "MSG_READY",
    "MSG_STALLED",
    "MSG_UPDATE",
    "MSG_WORKSPACE",
    "STACK_NOT_FOUND",
    "StackRef",
    "SyncDecision",
    "destroyed_nothing",
    "go_duration",
    "mark_cancelled",
    "mark_ephemeral_backend",
    "mark_ready",
    "mark_reconciling",
    "mark_result",
    "mark_stalled",
    "outputs_from_secret",
    "parse_time",
    "plan_sync",
    "reconcile_request",
    "record_cancelled",
    "record_destroyed_nothing",
    "record_failed",
    "record_succeeded",
    "requirement_error",
    "resources_after",
    "retry_schedule",
]

Obj = dict[str, Any]

READY: Final = "Ready"
RECONCILING: Final = "Reconciling"
STALLED: Final = "Stalled"
SUSPENDED: Final = "Suspended"
EPHEMERAL_BACKEND: Final = "EphemeralBackend"

MSG_IN_PROGRESS: Final = "reconciliation is in progress"
MSG_STALLED: Final = "reconciliation is stalled"
MSG_READY: Final = "the stack has been processed and is up to date"
MSG_WORKSPACE: Final = "waiting for workspace readiness"
MSG_UPDATE: Final = "stack is being processed"
MSG_SUSPENDED: Final = "spec.suspend is set: no new operation starts until it is cleared"

SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"

MSG_NOT_RUN: Final = "prerequisite has not run to completion"
MSG_PREREQ_FAILED: Final = "prerequisite failed"
MSG_OUT_OF_DATE: Final = "prerequisite is out of date"


def reconcile_request(obj: Mapping[str, Any]) -> str:
    """The ``pulumi.com/reconciliation-request`` annotation ("" when absent, as Go)."""
    return str(
        ((obj.get("metadata") or {}).get("annotations") or {}).get(RECONCILIATION_REQUEST_ANNOTATION, "")
    )


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String`` prints whole seconds (``1m30s``, ``24h0m0s``)."""
    total = round(seconds)
    if total < 60:
        return f"{total}s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


# --- conditions ------------------------------------------------------------------------------


def _conditions(status: Obj) -> list[Obj]:
    return list(status.get("conditions") or [])


def mark_reconciling(status: Obj, reason: str, message: str, generation: int | None, now: datetime) -> None:
    conditions = remove_condition(_conditions(status), STALLED)
    conditions = set_condition(
        conditions, READY, "False", "NotReadyInProgress", MSG_IN_PROGRESS, generation, now
    )
    status["conditions"] = set_condition(conditions, RECONCILING, "True", reason, message, generation, now)


def mark_stalled(status: Obj, reason: str, message: str, generation: int | None, now: datetime) -> None:
    conditions = remove_condition(_conditions(status), RECONCILING)
    conditions = set_condition(conditions, READY, "False", "NotReadyStalled", MSG_STALLED, generation, now)
    status["conditions"] = set_condition(conditions, STALLED, "True", reason, message, generation, now)


def mark_ready(status: Obj, generation: int | None, now: datetime) -> None:
    conditions = remove_condition(remove_condition(_conditions(status), RECONCILING), STALLED)
    status["conditions"] = set_condition(
        conditions, READY, "True", "ProcessingCompleted", MSG_READY, generation, now
    )


def mark_ephemeral_backend(status: Obj, message: str | None, generation: int | None, now: datetime) -> None:
    """(extension) An ``EphemeralBackend`` condition while the Stack's state is kept where its
    workspace pod's replacement loses it (``message`` says where; None removes it). A warning:
    the Stack is not refused, and Ready says nothing of it."""
    conditions = _conditions(status)
    if message is None:
        status["conditions"] = remove_condition(conditions, EPHEMERAL_BACKEND)
    else:
        status["conditions"] = set_condition(
            conditions, EPHEMERAL_BACKEND, "True", EPHEMERAL_BACKEND, message, generation, now
        )


def mark_suspended(status: Obj, suspended: bool, generation: int | None, now: datetime) -> None:
    """(extension) A ``Suspended`` condition while ``spec.suspend`` holds; nothing is reconciling then,
    and no retry is due (``nextRetryTime`` and its metric go until the Stack is resumed)."""
    conditions = _conditions(status)
    if suspended:
        status.pop("nextRetryTime", None)
        conditions = remove_condition(conditions, RECONCILING)
        if not is_true(conditions, READY) and get_condition(conditions, STALLED) is None:
            conditions = set_condition(
                conditions, READY, "False", "Suspended", MSG_SUSPENDED, generation, now
            )
        conditions = set_condition(conditions, SUSPENDED, "True", "Suspended", MSG_SUSPENDED, generation, now)
    else:
        conditions = remove_condition(conditions, SUSPENDED)
    status["conditions"] = conditions


# --- recording a completed Update ------------------------------------------------------------


def _same_inputs(last: Mapping[str, Any] | None, current: Mapping[str, Any]) -> bool:
    """The failed attempt ran with the same generation, reconcile request and source revision."""
    return (
        last is not None
        and last.get("generation") == current.get("generation")
        and (last.get("reconcileRequest") or "") == (current.get("reconcileRequest") or "")
        and (last.get("lastAttemptedCommit") or "") == (current.get("commit") or "")
        and (last.get("policyPacksDigest") or "") == (current.get("policyPacksDigest") or "")
    )


def _failed_reason(update: Mapping[str, Any]) -> str | None:
    condition = get_condition((update.get("status") or {}).get("conditions"), "Failed")
    return str(condition.get("reason")) if condition else None


def _compact(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if v not in (None, "")}


def record_failed(status: Obj, current: Mapping[str, Any], update: Mapping[str, Any], now: datetime) -> None:
    """Record a failed Update in ``lastUpdate`` and classify it in ``lastFailure`` (Go: markStackFailed)."""
    upd_status = update.get("status") or {}
    last = status.get("lastUpdate")
    same = _same_inputs(last, current)
    message = str(upd_status.get("message") or "")
    status["lastUpdate"] = _compact(
        {
            "generation": current.get("generation"),
            "reconcileRequest": current.get("reconcileRequest"),
            "name": (update.get("metadata") or {}).get("name"),
            "type": (update.get("spec") or {}).get("type"),
            "state": FAILED,
            "message": message,
            "lastAttemptedCommit": current.get("commit"),
            "lastSuccessfulCommit": (last or {}).get("lastSuccessfulCommit"),
            "permalink": upd_status.get("permalink"),
            "lastResyncTime": format_time(now),
            "policyPacksDigest": current.get("policyPacksDigest"),
        }
    )
    status["lastUpdate"]["failures"] = int((last or {}).get("failures") or 0) + 1 if same else 0
    kind = classify_failure(_failed_reason(update), message)
    previous = status.get("lastFailure") if same else None
    counted = int((previous or {}).get("countedFailures") or 0) + (0 if kind.transient else 1)
    failure: Obj = {
        "reason": kind.reason,
        "message": tail_lines(message) or kind.reason,
        "transient": kind.transient,
        "updateName": (update.get("metadata") or {}).get("name"),
        "countedFailures": counted,
    }
    if kind.lock_owner:
        failure["lockOwner"] = kind.lock_owner
    if kind.pending_operations:
        failure["pendingOperations"] = list(kind.pending_operations)
    status["lastFailure"] = failure


CANCELLED: Final = "Cancelled"


def record_cancelled(
    status: Obj, current: Mapping[str, Any], update: Mapping[str, Any], token: str, now: datetime
) -> None:
    """Record an Update cancelled on request (``pulumi.com/cancel-request`` = ``token``) as failed
    with reason ``Cancelled``: not retried until the next change (spec, source or a request)."""
    record_failed(status, current, update, now)
    name = (update.get("metadata") or {}).get("name")
    status["lastUpdate"]["message"] = f"cancelled on request {token!r}"
    status["lastFailure"] = {
        "reason": CANCELLED,
        "message": f"Update {name} was cancelled on request {token!r} (pulumi.com/cancel-request)",
        "transient": False,
        "updateName": name,
        "countedFailures": 0,
    }


def mark_cancelled(status: Obj, message: str, generation: int | None, now: datetime) -> None:
    """Ready=False ``Cancelled``: a person stopped the operation; nothing runs until the next change
    (neither Reconciling nor Stalled: nothing failed)."""
    conditions = remove_condition(remove_condition(_conditions(status), RECONCILING), STALLED)
    status["conditions"] = set_condition(conditions, READY, "False", CANCELLED, message, generation, now)


def record_lost(status: Obj, current: Mapping[str, Any], now: datetime) -> None:
    """The Update in ``currentUpdate`` is gone before it completed: count a transient failure."""
    lost = {
        "metadata": {"name": current.get("name")},
        "spec": {"type": (status.get("lastUpdate") or {}).get("type") or "up"},
        "status": {
            "message": f"the Update {current.get('name')} was deleted before it completed",
            "conditions": [{"type": "Failed", "status": "True", "reason": "UpdateLost"}],
        },
    }
    record_failed(status, current, lost, now)


def outputs_from_secret(secret: Mapping[str, Any]) -> Obj:
    """Stack outputs from an Update's outputs Secret: JSON values, ``[secret]`` for secret keys."""
    annotation = ((secret.get("metadata") or {}).get("annotations") or {}).get(SECRETS_ANNOTATION)
    secret_keys: set[str] = set()
    if annotation:
        try:
            secret_keys = {str(k) for k in json.loads(annotation)}
        except (ValueError, TypeError):
            secret_keys = set()
    outputs: Obj = {}
    for key in sorted(secret.get("data") or {}):
        if key in secret_keys:
            outputs[key] = "[secret]"
            continue
        try:
            raw = base64.b64decode(secret["data"][key])
            outputs[key] = json.loads(raw)
        except (binascii.Error, ValueError):
            outputs[key] = None
    return outputs


def record_succeeded(
    status: Obj,
    current: Mapping[str, Any],
    update: Mapping[str, Any],
    outputs: Obj | None,
    now: datetime,
) -> None:
    """Record a successful Update (Go: markStackSucceeded); ``outputs`` None keeps the old ones."""
    upd_status = update.get("status") or {}
    if outputs is not None:
        status["outputs"] = outputs
    status["lastUpdate"] = _compact(
        {
            "generation": current.get("generation"),
            "reconcileRequest": current.get("reconcileRequest"),
            "name": (update.get("metadata") or {}).get("name"),
            "type": (update.get("spec") or {}).get("type"),
            "state": SUCCEEDED,
            "lastAttemptedCommit": current.get("commit"),
            "lastSuccessfulCommit": current.get("commit"),
            "permalink": upd_status.get("permalink"),
            "lastResyncTime": format_time(now),
            "policyPacksDigest": current.get("policyPacksDigest"),
        }
    )
    status["lastUpdate"]["failures"] = 0
    status.pop("lastFailure", None)
    count = resources_after(update)
    if count is not None:
        status["resourceCount"] = count
    info = upd_status.get("projectInfo")
    if isinstance(info, Mapping) and info.get("name") and info.get("runtime"):
        status["projectInfo"] = {"name": info["name"], "runtime": info["runtime"]}


# --- what the stack holds, and a destroy that found none of it --------------------------------

STACK_NOT_FOUND: Final = "StackNotFound"
# Operations that leave a resource in the state (a summary's counts by operation).
_KEPT_OPS: Final = frozenset({"create", "update", "same", "replace", "read", "import", "refresh"})


def resources_after(update: Mapping[str, Any]) -> int | None:
    """How many resources the stack holds after a successful ``update`` (from its
    ``resourceChanges``); None for a preview or when the Update did not say."""
    spec_type = (update.get("spec") or {}).get("type")
    changes = (update.get("status") or {}).get("resourceChanges")
    if spec_type == "destroy":
        return 0
    if spec_type == "preview" or not isinstance(changes, Mapping):
        return None
    return sum(int(v) for k, v in changes.items() if k in _KEPT_OPS)


def destroyed_nothing(status: Mapping[str, Any], update: Mapping[str, Any]) -> str | None:
    """Why a destroy that succeeded is not done: the stack it ran in held none of the resources the
    Stack last deployed (``status.resourceCount``), e.g. an empty stack created where the state was
    lost with a workspace pod. None when it deleted something, or nothing was known to delete."""
    if (update.get("spec") or {}).get("type") != "destroy":
        return None
    known = int(status.get("resourceCount") or 0)
    changes = (update.get("status") or {}).get("resourceChanges") or {}
    if known <= 0 or int(changes.get("delete") or 0) > 0:
        return None
    stack = (update.get("spec") or {}).get("stackName") or ""
    return (
        f"the destroy deleted nothing: stack {stack!r} holds none of the {known} resource(s) this Stack "
        "last deployed (its state was lost, e.g. kept on the disk of a replaced workspace pod)"
    )


def record_destroyed_nothing(
    status: Obj, current: Mapping[str, Any], update: Mapping[str, Any], message: str, now: datetime
) -> None:
    """Record a destroy that found none of the Stack's resources as failed with ``StackNotFound``
    (the Update itself succeeded: the engine destroyed the empty stack it was given)."""
    found = {
        "metadata": update.get("metadata") or {},
        "spec": update.get("spec") or {},
        "status": {
            **(update.get("status") or {}),
            "message": message,
            "conditions": [{"type": "Failed", "status": "True", "reason": STACK_NOT_FOUND}],
        },
    }
    record_failed(status, current, found, now)


# --- retries and the result conditions -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetrySchedule:
    """For a failed ``lastUpdate``: whether the failure budget is spent, else when to retry."""

    stalled: bool
    delay: float
    at: datetime | None


def retry_schedule(
    status: Mapping[str, Any], spec: StackSpec, settings: RetrySettings
) -> RetrySchedule | None:
    """None unless the last update failed."""
    last = status.get("lastUpdate") or {}
    if last.get("state") != FAILED:
        return None
    failure = status.get("lastFailure") or {}
    if failure.get("reason") in STALL_AT_ONCE:
        return RetrySchedule(True, 0.0, None)
    transient = bool(failure.get("transient"))
    failures = int(last.get("failures") or 0)
    # Without lastFailure (a status the Go operator wrote), every failure counted, as in Go.
    counted = int(failure.get("countedFailures") or 0) if failure else failures + 1
    if not transient and counted > failure_budget(spec, settings):
        return RetrySchedule(True, 0.0, None)
    exponent = failures if transient else max(counted - 1, 0)
    seed = str(last.get("name") or "")
    delay = retry_delay(transient=transient, failures=exponent, spec=spec, settings=settings, seed=seed)
    attempted = parse_time(last.get("lastResyncTime"))
    at = retry_at(attempted, delay) if attempted else None
    return RetrySchedule(False, delay, at)


def mark_result(
    status: Obj,
    spec: StackSpec,
    settings: RetrySettings,
    generation: int | None,
    now: datetime,
    *,
    stack: StackRef | None = None,
    retrying: str | None = None,
) -> None:
    """Conditions and ``nextRetryTime`` from the outcome of ``lastUpdate`` (Go: markStackResult);
    ``stack`` names the Stack in the commands a stalled message gives. ``retrying`` says why a
    Stack whose last update succeeded is not Ready yet (a refresh request waiting for its retry):
    Reconciling ``RetryingAfterFailure``, as an up's transient retry."""
    last = status.get("lastUpdate") or {}
    schedule = retry_schedule(status, spec, settings)
    if schedule is None or schedule.stalled:
        status.pop("nextRetryTime", None)
    elif schedule.at is not None:
        status["nextRetryTime"] = format_time(schedule.at)
    if last.get("state") == SUCCEEDED:
        if retrying:
            mark_reconciling(status, "RetryingAfterFailure", retrying, generation, now)
        else:
            mark_ready(status, generation, now)
        return
    failures = int(last.get("failures") or 0)
    type_ = str(last.get("type") or "up")
    reason = (status.get("lastFailure") or {}).get("reason")
    if schedule is not None and schedule.stalled and reason == CANCELLED:
        message = str((status.get("lastFailure") or {}).get("message") or "cancelled on request")
        mark_cancelled(
            status, f"{message}; nothing runs until the spec, source or a request changes", generation, now
        )
    elif schedule is not None and schedule.stalled and reason == STACK_NOT_FOUND:
        mark_stalled(status, STACK_NOT_FOUND, stack_not_found_message(status, stack, type_), generation, now)
    elif schedule is not None and schedule.stalled and reason == POLICY_VIOLATION:
        said = str((status.get("lastFailure") or {}).get("message") or "a mandatory policy was violated")
        message = f"{said}\nnot retrying until the program, a policy pack or the spec changes"
        mark_stalled(status, POLICY_VIOLATION, message, generation, now)
    elif schedule is not None and schedule.stalled:
        message = f"{type_} failed {max(failures, 1)} times; not retrying until the spec or source changes"
        mark_stalled(status, "UpdateFailed", message, generation, now)
    elif type_ == "preview":
        mark_reconciling(status, "PreviewFailed", f"preview failed ({failures} attempt(s))", generation, now)
    else:
        mark_reconciling(status, "RetryingAfterFailure", f"{failures} update failure(s)", generation, now)


# --- whether to run an operation -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncDecision:
    """``synced``: nothing to run now (then ``requeue_after`` seconds, if set, says when to look
    again); otherwise ``message`` says why an operation runs (the StackUpdateDetected event)."""

    synced: bool
    message: str = ""
    requeue_after: float | None = None


def _since(value: Any, now: datetime) -> float:
    when = parse_time(value)
    return (now - when).total_seconds() if when else float("inf")


def plan_sync(
    obj: Mapping[str, Any],
    spec: StackSpec,
    status: Mapping[str, Any],
    current_commit: str,
    now: datetime,
    settings: RetrySettings,
    *,
    polls_branch: bool = False,
    packs_digest: str = "",
) -> SyncDecision:
    """Whether ``obj`` (the Stack as read) is in sync with ``current_commit`` (Go: isSynced), and
    when to look again if so (resync, branch poll, retry). ``packs_digest``: that of the policy
    packs the WorkspaceTemplates enforce now (:mod:`pko.controllers.stack.policypacks`)."""
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    deleting = bool(meta.get("deletionTimestamp"))
    last = status.get("lastUpdate")
    if not last:
        return SyncDecision(False, "Initial stack update")
    if last.get("generation") != generation:
        return SyncDecision(
            False, "Stack marked for deletion" if deleting else f"New stack generation: {generation}"
        )
    request = reconcile_request(obj)
    if (last.get("reconcileRequest") or "") != request:
        return SyncDecision(False, f'Sync request: "{request}"')
    if not deleting and (last.get("policyPacksDigest") or "") != packs_digest:
        # One digest covers them all (policypacks.packs_digest): the message names each thing it covers.
        changed = (
            "Enforced policy packs changed (WorkspaceTemplate spec.policyPacks), a pack's git commit, "
            "or a pack's Flux artifact digest"
        )
        return SyncDecision(False, changed)
    resync = float(spec.resync_frequency())
    state = last.get("state")
    requeue: float | None = None
    if state == SUCCEEDED:
        if deleting:
            if last.get("type") == "destroy":
                return SyncDecision(True)
            return SyncDecision(False, "Stack marked for deletion")
        if (last.get("lastSuccessfulCommit") or "") != current_commit:
            return SyncDecision(False, f'New commit detected: "{current_commit}"')
        if spec.continue_resync_on_commit_match:
            elapsed = _since(last.get("lastResyncTime"), now)
            if elapsed >= resync:
                return SyncDecision(False, f"Resync time elapsed: {go_duration(resync)}")
            requeue = max(1.0, resync - elapsed)
    elif state == FAILED:
        if (last.get("lastAttemptedCommit") or "") != current_commit:
            return SyncDecision(False, f'New commit detected: "{current_commit}"')
        schedule = retry_schedule(status, spec, settings)
        if schedule is not None and not schedule.stalled:
            elapsed = _since(last.get("lastResyncTime"), now)
            if elapsed >= schedule.delay:
                return SyncDecision(False, f"Backoff time elapsed: {go_duration(schedule.delay)}")
            requeue = max(1.0, schedule.delay - elapsed)
    if polls_branch and not deleting:
        seed = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        poll = next_poll(seed, resync, now)
        requeue = min(poll, requeue) if requeue is not None else poll
    return SyncDecision(True, "", requeue)


# --- prerequisites ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequirementError:
    """Why a prerequisite Stack is not satisfied; ``touch`` is the reconcile request that makes it
    resync (set when it is out of date), else None."""

    message: str
    touch: str | None = None


def requirement_error(
    prereq: Mapping[str, Any], within: timedelta | None, now: datetime
) -> RequirementError | None:
    """None if ``prereq`` (a Stack) satisfies the requirement (Go: isRequirementSatisfied)."""
    status = prereq.get("status") or {}
    last = status.get("lastUpdate")
    generation = (prereq.get("metadata") or {}).get("generation")
    if (
        not last
        or last.get("generation") != generation
        or (last.get("reconcileRequest") or "") != reconcile_request(prereq)
    ):
        return RequirementError(MSG_NOT_RUN)
    if last.get("state") != SUCCEEDED:
        return RequirementError(MSG_PREREQ_FAILED)
    if within is not None and _since(last.get("lastResyncTime"), now) > within.total_seconds():
        return RequirementError(MSG_OUT_OF_DATE, f"after-{last.get('name')}")
    return None


def utcnow() -> datetime:
    """Now, in UTC, to the second (status times have second precision)."""
    return datetime.now(UTC).replace(microsecond=0)
