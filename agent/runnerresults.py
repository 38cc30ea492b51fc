"""What the runner's results say, from what the Automation API answered: the protobuf messages the
agent returns (summaries, change counts, outputs, captured output) built from its objects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import structlog
from pko.agent import failures
from pko.agent.operations import OperationRequest
from pko.api.generated.pko.agent import v1 as pb
from pulumi import automation as auto
from pulumi.automation import CommandResult

log = structlog.get_logger("pko.agent.pulumi")

# Bounds on captured CLI output kept in a result (the tail is kept).
MAX_CAPTURED_OUTPUT = 256 * 1024


def capped(text: str, limit: int = MAX_CAPTURED_OUTPUT) -> str:
    return text if len(text) <= limit else text[-limit:]


def error_text(exc: BaseException) -> tuple[str, str]:
    """(stdout, stderr) of a failed CLI command, when the error carries them."""
    result = getattr(exc, "command_result", None)
    if isinstance(result, CommandResult):
        return result.stdout, result.stderr
    return "", str(exc)


def project_info_of(settings: auto.ProjectSettings) -> pb.ProjectInfo:
    runtime = settings.runtime
    name = runtime if isinstance(runtime, str) else (runtime.name if runtime is not None else "")
    return pb.ProjectInfo(name=settings.name, runtime=name or "")


def stack_summary(s: auto.StackSummary) -> pb.StackSummary:
    return pb.StackSummary(
        name=s.name,
        last_update=s.last_update.replace(tzinfo=UTC)
        if s.last_update and not s.last_update.tzinfo
        else s.last_update,
        update_in_progress=bool(s.update_in_progress),
        resource_count=s.resource_count,
        url=s.url,
    )


def update_summary(s: auto.UpdateSummary | None) -> pb.UpdateSummary | None:
    if s is None:
        return None

    def aware(t: datetime | None) -> datetime | None:
        return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t

    return pb.UpdateSummary(
        start_time=aware(s.start_time),
        end_time=aware(s.end_time),
        result=s.result or "",
        message=s.message or "",
    )


def change_counts(changes: Mapping[Any, int] | None) -> dict[str, int]:
    """Resource counts by operation ("create", "same", "delete", ...): for a preview what it
    would do, for an update what it did (the operator keeps what a destroy is expected to delete)."""
    return {str(getattr(k, "value", k)): int(v) for k, v in (changes or {}).items()}


def output_values(outputs: auto.OutputMap) -> dict[str, pb.OutputValue]:
    """Stack outputs as the result carries them (JSON values, secrecy kept)."""
    return {
        k: pb.OutputValue(value=json.dumps(v.value).encode(), secret=bool(v.secret))
        for k, v in outputs.items()
    }


def log_changes(operation_id: str, changes: list[pb.ResourceChange]) -> None:
    """One ``resource change`` line per entry of an operation's change set: the whole set, where a
    person reads it when the Update's ``status.changes`` lists only its first entries
    (``pko.api.limits``: the operator bounds what it records, the log is not bounded)."""
    for change in changes:
        log.info(
            "resource change",
            operation=operation_id,
            urn=change.urn,
            type=change.type,
            op=change.op,
            paths=list(change.paths),
        )


def done_counts(s: auto.UpdateSummary | None) -> dict[str, int]:
    """What an up, refresh or destroy did, from its summary (empty when the history had none)."""
    return change_counts(s.resource_changes if s is not None else None)


def permalink(stdout: str) -> str | None:
    # The Automation API for Python has no permalink accessor; the CLI prints it as the Go SDK reads it.
    for line in stdout.splitlines():
        for marker in ("View in Browser (Ctrl+O): ", "View Live: ", "Permalink: "):
            if marker in line:
                return line.split(marker, 1)[1].strip() or None
    return None


def writes_state(request: OperationRequest) -> bool:
    """Whether ``request`` writes the stack's state and leaves it in place: an up, a refresh that is
    not a preview, a destroy that keeps the stack."""
    if isinstance(request, pb.RefreshRequest):
        return not request.preview_only
    if isinstance(request, pb.DestroyRequest):
        return not request.remove
    return isinstance(request, pb.UpRequest)


def plan_not_found(out: pb.OperationResult, plan: str, started: datetime, kept: int) -> pb.OperationResult:
    """The result of an up whose plan this pod does not hold (no CLI ran)."""
    message = (
        f"no update plan of preview {plan!r} in this workspace pod: plans live in the pod (a replaced "
        f"pod has none), an up that used one deleted it, and only the newest {kept} are kept; preview again"
    )
    out.state = pb.OperationState.FAILED
    out.failure = pb.Failure(reason=failures.REASON_PLAN_NOT_FOUND, message=message)
    out.summary = pb.UpdateSummary(
        start_time=started, end_time=datetime.now(UTC), result="failed", message=message
    )
    log.warning("operation failed", operation=out.operation_id, reason=out.failure.reason, message=message)
    return out
