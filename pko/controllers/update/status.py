"""What an Update's status and outputs Secret say, as pure functions of the Update and the agent's answer.

Kept apart from the reconciler so the mapping (reasons, messages, conditions, the Secret's shape)
is tested without a cluster. Names follow the Go operator (``upstream-api-facts.md``): conditions
``Progressing``/``Complete``/``Failed``; a finished operation is ``Complete`` ``Updated`` whatever
its result, and ``Failed`` says how it went (``UpdateSucceeded``, ``UpdateFailed`` or the agent's
``Failure.reason``); an Update ended by the operator without a result (orphaned, deleted, its
operation lost) is ``Progressing`` ``Failed``, ``Complete`` ``Failed`` and ``Failed`` with why
(``Canceled``, ...), as the Go operator's ``markFailed`` ends an orphaned or deleted Update.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pko.api.generated.pko.agent import v1 as pb
from pko.api.limits import MAX_MESSAGE_CHARS, MAX_OUTPUTS_BYTES
from pko.api.stackterms import PLAN_OPS, resource_ops
from pko.api.update import CONDITION_COMPLETE, CONDITION_FAILED, CONDITION_PROGRESSING
from pko.controllers.bounds import bounded_list, cap_head, cap_tail
from pko.controllers.resources import (
    OMITTED_OUTPUTS_ANNOTATION,
    SECRETS_ANNOTATION,
    UPDATE_COMPONENT,
    UPDATE_NAME_LABEL,
    WORKSPACE_COMPONENT_LABEL,
)
from pko.controllers.update.policy import request_packs, violation_fields
from pko.machinery.conditions import format_time, get_condition, set_condition
from pko.machinery.objects import set_controller_reference
from pko.machinery.resource import Obj

__all__ = [
    "REASON_CANCELED",
    "REASON_COMPLETE",
    "REASON_FAILED",
    "REASON_OPERATION_LOST",
    "REASON_PLAN_NOT_FOUND",
    "REASON_PROGRESSING",
    "REASON_STACK_NOT_FOUND",
    "REASON_TRANSIENT_FAILURE",
    "REASON_UNREACHABLE",
    "REASON_UPDATED",
    "REASON_UPDATE_FAILED",
    "REASON_UPDATE_SUCCEEDED",
    "REASON_WORKSPACE_NOT_FOUND",
    "REASON_WORKSPACE_NOT_READY",
    "change_fields",
    "ended_status",
    "failed_reason",
    "is_complete",
    "is_running",
    "operation_request",
    "outputs_secret",
    "outputs_secret_name",
    "plan_problem",
    "removed_lock_note",
    "result_message",
    "result_status",
    "sanitize_output_key",
    "started_status",
    "status_changes",
    "status_pending",
    "waiting_status",
]

# Progressing reasons (and ``REASON_FAILED``: ended by the operator without a result).
REASON_PROGRESSING: Final = "Progressing"
REASON_COMPLETE: Final = "Complete"
REASON_WORKSPACE_NOT_FOUND: Final = "WorkspaceNotFound"
REASON_WORKSPACE_NOT_READY: Final = "WorkspaceNotReady"
REASON_TRANSIENT_FAILURE: Final = "TransientFailure"
# Complete reasons: the operation finished (whatever its result), or the operator ended it.
REASON_UPDATED: Final = "Updated"
REASON_FAILED: Final = "Failed"
# Failed reasons (besides the agent's Failure.reason).
REASON_UPDATE_SUCCEEDED: Final = "UpdateSucceeded"
REASON_UPDATE_FAILED: Final = "UpdateFailed"
REASON_CANCELED: Final = "Canceled"
# The stack is not in the backend, and the operation (destroy, refresh) must not create it.
REASON_STACK_NOT_FOUND: Final = "StackNotFound"
# The agent no longer knows the operation (its pod was replaced, or its journal lost).
REASON_OPERATION_LOST: Final = "OperationLost"
# The agent could not be reached for longer than the controller waits.
REASON_UNREACHABLE: Final = "AgentUnreachable"
# An up's ``plan`` names no preview that saved one (the agent says the same when its pod lacks it).
REASON_PLAN_NOT_FOUND: Final = "PlanNotFound"

# The agent says "Cancelled"; the Go operator's reason is "Canceled".
_REASON_ALIASES: Final = {"Cancelled": REASON_CANCELED}
_UNSAFE_KEY: Final = re.compile(r"[^-._a-zA-Z0-9]")
MESSAGE_LINES: Final = 10
MESSAGE_MAX_CHARS: Final = MAX_MESSAGE_CHARS
# Output names listed in the omitted-outputs annotation (the rest are counted).
_MAX_OMITTED_LISTED: Final = 50
_MAX_PENDING_LISTED: Final = 10


def is_complete(update: Obj) -> bool:
    """The result is recorded: nothing will run again for this Update."""
    conditions = (update.get("status") or {}).get("conditions")
    c = get_condition(conditions, CONDITION_COMPLETE)
    return c is not None and c.get("status") == "True"


def is_running(update: Obj) -> bool:
    """An operation was started in the agent and its result is not recorded yet."""
    if is_complete(update):
        return False
    conditions = (update.get("status") or {}).get("conditions")
    c = get_condition(conditions, CONDITION_PROGRESSING)
    return c is not None and c.get("status") == "True" and c.get("reason") == REASON_PROGRESSING


def sanitize_output_key(key: str) -> str:
    """A Secret data key for output ``key``: every character outside ``[-._a-zA-Z0-9]`` becomes ``_``."""
    return _UNSAFE_KEY.sub("_", key)


def outputs_secret_name(update_name: str) -> str:
    return f"{update_name}-stack-outputs"


def outputs_secret(update: Obj, outputs: Mapping[str, pb.OutputValue]) -> Obj:
    """The immutable Secret holding ``outputs`` (JSON values), controlled by ``update``.

    The keys of secret outputs are listed (sanitised, sorted) in the ``pulumi.com/secrets``
    annotation, so the Stack can keep them secret in its own status. Outputs are taken by key
    while their keys and values fit in ``MAX_OUTPUTS_BYTES`` (a Secret holds 1 MiB, and the Stack
    copies them into its status); one that does not is left out and named in the
    ``pulumi.com/omitted-outputs`` annotation (``{"count": n, "keys": [the first 50]}``).
    """
    meta = update.get("metadata") or {}
    name = str(meta.get("name", ""))
    data: dict[str, str] = {}
    secret_keys: list[str] = []
    omitted: list[str] = []
    size = 0
    for key, value in sorted(outputs.items(), key=lambda kv: sanitize_output_key(kv[0])):
        safe = sanitize_output_key(key)
        raw = bytes(value.value)
        if size + len(safe) + len(raw) > MAX_OUTPUTS_BYTES:
            omitted.append(safe)
            continue
        size += len(safe) + len(raw)
        data[safe] = base64.b64encode(raw).decode("ascii")
        if value.secret:
            secret_keys.append(safe)
    annotations = {SECRETS_ANNOTATION: json.dumps(sorted(set(secret_keys)))}
    if omitted:
        listed = {"count": len(omitted), "keys": omitted[:_MAX_OMITTED_LISTED]}
        annotations[OMITTED_OUTPUTS_ANNOTATION] = json.dumps(listed)
    secret: Obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": outputs_secret_name(name),
            "namespace": meta.get("namespace"),
            "labels": {WORKSPACE_COMPONENT_LABEL: UPDATE_COMPONENT, UPDATE_NAME_LABEL: name},
            "annotations": annotations,
        },
        "immutable": True,
        "type": "Opaque",
        "data": data,
    }
    set_controller_reference(update, secret, block_owner_deletion=True)
    return secret


def failed_reason(result: pb.OperationResult) -> str:
    """The ``Failed`` condition's reason for a finished operation."""
    if result.state == pb.OperationState.SUCCEEDED:
        return REASON_UPDATE_SUCCEEDED
    reason = result.failure.reason if result.failure is not None else ""
    if not reason:
        return REASON_CANCELED if result.state == pb.OperationState.CANCELLED else REASON_UPDATE_FAILED
    return _REASON_ALIASES.get(reason, reason)


def _tail(text: str, lines: int = MESSAGE_LINES) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def _cap(message: str) -> str:
    return cap_tail(message, MESSAGE_MAX_CHARS)


def _listed_pending(pending: list[pb.PendingOperation]) -> str:
    listed = ", ".join(f"{op.type} {op.urn}" for op in pending[:_MAX_PENDING_LISTED])
    more = f" and {len(pending) - _MAX_PENDING_LISTED} more" if len(pending) > _MAX_PENDING_LISTED else ""
    return listed + more


def removed_lock_note(result: pb.OperationResult) -> str:
    """What the agent says when a stale lock of the workspace pod stopped the operation's first
    attempt (``removed_lock``: it removed the lock and ran the operation once more): whose lock, taken
    when, and the pending operations the update it interrupted left, whose resources the user checks;
    "" when no lock was removed."""
    removed = result.removed_lock
    if removed is None:
        return ""
    lock = removed.lock or pb.LockInfo()
    owner = lock.owner or "an unknown owner"
    when = _timestamp(lock.acquired)
    taken = f", taken at {when}" if when else ""
    note = (
        f"removed the stack's lock held by {owner}{taken}: a process of this workspace pod that no "
        "longer runs (an update it interrupted), so the operation ran again"
    )
    pending = list(removed.pending_operations)
    if pending:
        note += (
            f"; that update left {len(pending)} pending operation(s), check each resource: "
            + _listed_pending(pending)
        )
    return note


def result_message(result: pb.OperationResult) -> str:
    """``status.message``: for a failure, its message, the lock owner and pending operations the agent
    reported, then the last lines of Pulumi's error output (never the whole log); for a success, the
    update's message. When the agent removed a stale lock of the workspace pod to run the operation,
    which lock and what the update it interrupted left (:func:`removed_lock_note`): first for a
    success, after the failure's own message for a failure."""
    failure = result.failure
    note = removed_lock_note(result)
    if result.state == pb.OperationState.SUCCEEDED or failure is None:
        summary = result.summary.message if result.summary is not None else ""
        if result.state == pb.OperationState.SUCCEEDED:
            return cap_head("\n".join(line for line in (note, summary) if line), MESSAGE_MAX_CHARS)
        tail = "\n".join(_tail(result.stderr)) or summary or "the operation failed"
        return _cap("\n".join(line for line in (note, tail) if line))
    lines: list[str] = [failure.message] if failure.message else []
    if note:
        lines.append(note)
    if failure.lock is not None and (failure.lock.owner or failure.lock.location):
        held = f"lock held by {failure.lock.owner or 'an unknown owner'}"
        if failure.lock.location:
            held += f" at {failure.lock.location}"
        lines.append(held)
    pending = list(failure.pending_operations)
    if pending:
        lines.append(f"pending operations: {_listed_pending(pending)}")
    detail = [line for line in _tail(failure.detail or result.stderr) if line not in lines]
    lines.extend(detail)
    return _cap("\n".join(lines) or "the operation failed")


def _conditions(
    update: Obj,
    generation: int | None,
    now: datetime,
    *entries: tuple[str, str, str, str],
) -> list[Obj]:
    conditions: list[Obj] | None = (update.get("status") or {}).get("conditions")
    for type_, status, reason, message in entries:
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)  # type: ignore[arg-type]
    return conditions or []


# The status fields this controller owns (every apply restates all of them).
STATUS_FIELDS: Final = (
    "observedGeneration",
    "conditions",
    "startTime",
    "endTime",
    "permalink",
    "message",
    "outputs",
    "projectInfo",
    "resourceChanges",
    "changes",
    "changeCount",
    "changesTruncated",
    "changeSummary",
    "pendingOperations",
    "clearedPendingOperations",
    "policyViolations",
    "policyViolationCount",
)


def _base(update: Obj) -> tuple[Obj, int | None]:
    """The status fields this controller owns, carried over."""
    old: Obj = update.get("status") or {}
    generation = (update.get("metadata") or {}).get("generation")
    status: Obj = {k: old[k] for k in STATUS_FIELDS[2:] if k in old}
    if generation is not None:
        status["observedGeneration"] = generation
    return status, generation


def waiting_status(update: Obj, reason: str, message: str, now: datetime | None = None) -> Obj:
    """Not started yet: ``Progressing`` False with why (workspace missing or not ready, agent unreachable)."""
    now = now or datetime.now(UTC)
    status, gen = _base(update)
    status["conditions"] = _conditions(
        update,
        gen,
        now,
        (CONDITION_PROGRESSING, "False", reason, message),
        (CONDITION_COMPLETE, "False", REASON_PROGRESSING, ""),
        (CONDITION_FAILED, "False", REASON_PROGRESSING, ""),
    )
    return status


def started_status(update: Obj, now: datetime | None = None) -> Obj:
    """The operation runs in the agent."""
    now = now or datetime.now(UTC)
    status, gen = _base(update)
    status.setdefault("startTime", format_time(now))
    status["conditions"] = _conditions(
        update,
        gen,
        now,
        (CONDITION_PROGRESSING, "True", REASON_PROGRESSING, "the operation is running"),
        (CONDITION_COMPLETE, "False", REASON_PROGRESSING, ""),
        (CONDITION_FAILED, "False", REASON_PROGRESSING, ""),
    )
    return status


def _timestamp(value: datetime | None) -> str | None:
    if value is None or value.year <= 1970:
        return None
    return format_time(value)


def result_status(
    update: Obj, result: pb.OperationResult, outputs: str | None, now: datetime | None = None
) -> Obj:
    """The recorded result of a finished operation."""
    now = now or datetime.now(UTC)
    status, gen = _base(update)
    summary = result.summary
    start = _timestamp(summary.start_time) if summary is not None else None
    end = _timestamp(summary.end_time) if summary is not None else None
    status.setdefault("startTime", start or format_time(now))
    status["endTime"] = end or format_time(now)
    message = result_message(result)
    if message:
        status["message"] = message
    if result.permalink:
        status["permalink"] = result.permalink
    if outputs:
        status["outputs"] = outputs
    info = result.project_info
    if info is not None and info.name:
        status["projectInfo"] = {"name": info.name, "runtime": info.runtime}
    if result.change_summary:
        status["resourceChanges"] = {k: int(v) for k, v in sorted(result.change_summary.items())}
    if result.changes:
        status.update(change_fields(result.changes))
    remaining = result.pending_operations or (result.failure.pending_operations if result.failure else [])
    if remaining:
        status["pendingOperations"] = status_pending(remaining)
    if result.cleared_pending_operations:
        status["clearedPendingOperations"] = status_pending(result.cleared_pending_operations)
    status.update(violation_fields(result.policy_violations))
    reason = failed_reason(result)
    succeeded = result.state == pb.OperationState.SUCCEEDED
    failed_message = "" if succeeded else (message.splitlines()[0] if message else "")
    status["conditions"] = _conditions(
        update,
        gen,
        now,
        (CONDITION_PROGRESSING, "False", REASON_COMPLETE, ""),
        (CONDITION_COMPLETE, "True", REASON_UPDATED, ""),
        (CONDITION_FAILED, "False" if succeeded else "True", reason, failed_message),
    )
    return status


def status_changes(items: list[pb.ResourceChange]) -> list[Obj]:
    """The agent's whole change set as the CRD spells it (``paths`` only when known), sorted by urn,
    then op (the agent sends it so; sorted again so the listed prefix is stable whatever it sends)."""
    out: list[Obj] = []
    for item in sorted(items, key=lambda c: (c.urn, c.op)):
        entry: Obj = {"urn": item.urn, "type": item.type, "op": item.op}
        if item.paths:
            entry["paths"] = list(item.paths)
        out.append(entry)
    return out


def change_fields(items: list[pb.ResourceChange]) -> Obj:
    """``changes`` (bounded: :func:`~pko.controllers.bounds.bounded_list`), ``changeCount``,
    ``changesTruncated`` when something is left out, and ``changeSummary``, counted over every change
    (what approval's summary and its destructive rule read, so a delete past the listed ones counts)."""
    whole = status_changes(items)
    listed = bounded_list(whole)
    summary = dict.fromkeys(PLAN_OPS, 0)
    for op in resource_ops(whole).values():
        summary[op] += 1
    fields: Obj = {"changes": listed.entries, "changeCount": listed.total, "changeSummary": summary}
    if listed.truncated:
        fields["changesTruncated"] = True
    return fields


def status_pending(items: list[pb.PendingOperation]) -> list[Obj]:
    """``status.pendingOperations`` / ``status.clearedPendingOperations``: each operation's urn and
    type, in the agent's order (the state's); bounded as ``changes`` are (the message and the
    agent's log count them all)."""
    return bounded_list({"urn": item.urn, "type": item.type} for item in items).entries


def ended_status(update: Obj, reason: str, message: str, now: datetime | None = None) -> Obj:
    """Ended by the operator without a result from the agent: orphaned, deleted, or its operation lost."""
    now = now or datetime.now(UTC)
    status, gen = _base(update)
    status["endTime"] = format_time(now)
    status["message"] = _cap(message)
    first = cap_head(message.splitlines()[0], MESSAGE_MAX_CHARS) if message else ""
    status["conditions"] = _conditions(
        update,
        gen,
        now,
        (CONDITION_PROGRESSING, "False", REASON_FAILED, ""),
        (CONDITION_COMPLETE, "True", REASON_FAILED, first),
        (CONDITION_FAILED, "True", reason, first),
    )
    return status


def plan_problem(update: Obj, source: Obj | None) -> str | None:
    """Why ``source``, the Update an up's ``spec.plan`` names, cannot have saved the plan it asks
    for (None: it can): it must be a preview with ``savePlan`` of the same workspace and stack that
    succeeded. Whether its pod still holds the plan only the agent knows."""
    spec: Obj = update.get("spec") or {}
    name = str(spec.get("plan") or "")
    if source is None:
        return f"the plan's preview Update {name!r} was not found"
    other: Obj = source.get("spec") or {}
    if other.get("type") != "preview" or other.get("savePlan") is not True:
        return f"Update {name!r} is not a preview that saves its plan (type preview, savePlan true)"
    for field in ("workspaceName", "stackName"):
        if other.get(field) != spec.get(field):
            return f"preview {name!r} ran with {field} {other.get(field)!r}, this up has {spec.get(field)!r}"
    conditions = (source.get("status") or {}).get("conditions")
    failed = get_condition(conditions, CONDITION_FAILED) or {}
    if not is_complete(source) or failed.get("status") != "False":
        return f"preview {name!r} has not succeeded, so it saved no plan"
    return None


def operation_request(update: Obj, plan_id: str | None = None) -> pb.StartOperationRequest:
    """``StartOperation`` for ``update``: its uid is the operation id, every spec option is passed on;
    ``plan_id``: for an up with ``spec.plan``, the operation id (uid) of the preview it names.

    Raises ValueError for an Update without a known type (the CRD normally refuses it).
    """
    spec: Obj = update.get("spec") or {}
    op_id = str((update.get("metadata") or {}).get("uid", ""))
    type_ = spec.get("type")
    common: dict[str, Any] = {
        "operation_id": op_id,
        "parallel": spec.get("parallel"),
        "message": spec.get("message"),
    }
    target = list(spec.get("target") or [])
    replace = list(spec.get("replace") or [])
    if type_ == "preview":
        return pb.StartOperationRequest(
            preview=pb.PreviewRequest(
                **common,
                expect_no_changes=spec.get("expectNoChanges"),
                replace=replace,
                target=target,
                target_dependents=spec.get("targetDependents"),
                refresh=spec.get("refresh"),
                save_plan=spec.get("savePlan"),
                policy_pack=request_packs(spec),
            )
        )
    if type_ == "up":
        return pb.StartOperationRequest(
            up=pb.UpRequest(
                **common,
                expect_no_changes=spec.get("expectNoChanges"),
                replace=replace,
                target=target,
                target_dependents=spec.get("targetDependents"),
                refresh=spec.get("refresh"),
                continue_on_error=spec.get("continueOnError"),
                plan=plan_id,
                policy_pack=request_packs(spec),
            )
        )
    if type_ == "refresh":
        return pb.StartOperationRequest(
            refresh=pb.RefreshRequest(
                **common,
                expect_no_changes=spec.get("expectNoChanges"),
                target=target,
                run_program=spec.get("runProgram"),
                preview_only=spec.get("previewOnly"),
            )
        )
    if type_ == "destroy":
        return pb.StartOperationRequest(
            destroy=pb.DestroyRequest(
                **common,
                target=target,
                target_dependents=spec.get("targetDependents"),
                refresh=spec.get("refresh"),
                continue_on_error=spec.get("continueOnError"),
                remove=spec.get("remove"),
                run_program=spec.get("runProgram"),
            )
        )
    raise ValueError(f"unsupported update type {type_!r}")
