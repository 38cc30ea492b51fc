"""Classified retries of failed Stack operations (pure): which failures are transient, and when to retry.

The Go operator retries every failure the same way (10 s x 3^failures, up to 24 h, at most 3
times), so a network blip can park a fleet for a day (its issue 1294) while a program error is
retried three times for nothing. Here a failure is first classified from the Update's ``Failed``
reason (the agent's closed set) and, for generic reasons, from the error text:

* transient (network, 5xx, 429, update conflict, a lock held by another run, a lost Update):
  retried after ``transient_base x transient_factor^n`` seconds with +-``jitter``, capped at
  ``transient_cap`` and ``max_backoff`` (after the jitter); never Stalls;
* deterministic (program, config, install or auth error, pending operations): by default the Go
  cooldown (``10 s x 3^n``), capped at ``max_backoff`` and, after ``max_update_failures``
  retries, Stalled ``UpdateFailed``.

Every setting is the operator's (``RetrySettings``, its ``--stack-*`` flags) unless the Stack sets
its own (``for_stack``, the one place that merges them; docs/retries.md). Jitter is derived from
the Update's name, so the delay of one failure is the same at every reconcile (no status churn)
while a fleet that failed together spreads out.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from pko.api.stack import FailureReason, StackSpec
from pko.controllers.retrysettings import RetrySettings

__all__ = [
    "STALL_AT_ONCE",
    "Classification",
    "classify_failure",
    "deterministic_delay",
    "failure_budget",
    "for_stack",
    "jitter_fraction",
    "retry_at",
    "retry_delay",
    "tail_lines",
    "transient_cap",
    "transient_delay",
]


# Update ``Failed`` reasons (the agent's PulumiErrorInfo reasons and the Update controller's own).
_REASONS: Final[dict[str, FailureReason]] = {
    "UpdateConflict": "UpdateConflict",
    "StackLocked": "StackLocked",
    "PendingOperations": "PendingOperations",
    "InvalidAccessToken": "AuthFailed",
    "Unauthenticated": "AuthFailed",
    "PermissionDenied": "AuthFailed",
    "AuthFailed": "AuthFailed",
    "ProgramError": "ProgramError",
    "ExpectedNoChanges": "ProgramError",
    "ResourceOperationFailed": "ResourceOperationFailed",
    "InstallationFailed": "InstallFailed",
    "InstallFailed": "InstallFailed",
    "InvalidArgument": "ConfigInvalid",
    "ConfigInvalid": "ConfigInvalid",
    "Canceled": "Transient",
    "Cancelled": "Transient",
    "Terminated": "Transient",
    "AgentRestarted": "Transient",
    "Aborted": "Transient",
    "TransientFailure": "Transient",
    "Unavailable": "Transient",
    "DeadlineExceeded": "Transient",
    "ResourceExhausted": "Transient",
    "WorkspaceNotFound": "Transient",
    "WorkspaceNotReady": "Transient",
    "UpdateLost": "UpdateLost",
    # The Update controller's own: the workspace pod was replaced (its agent no longer knows the
    # operation), or the agent could not be reached; a retry in a healthy pod is the remedy.
    "OperationLost": "UpdateLost",
    "AgentUnreachable": "Transient",
    "StackNotFound": "StackNotFound",
    "PlanNotFound": "OperationFailed",
    "PlanMismatch": "OperationFailed",
    "PolicyViolation": "PolicyViolation",
    "PolicyPackFailed": "PolicyPackFailed",
}
TRANSIENT_REASONS: Final[frozenset[FailureReason]] = frozenset(
    {"StackLocked", "UpdateConflict", "Transient", "UpdateLost"}
)
# Failures no retry can mend: only the user can (the Stack waits at once: Stalled, or Cancelled).
STALL_AT_ONCE: Final[frozenset[FailureReason]] = frozenset({"StackNotFound", "Cancelled", "PolicyViolation"})

# Error text that means "try again later", whatever reason the Update gave.
_TRANSIENT_TEXT: Final = re.compile(
    r"\b(429|too many requests|rate limit|50[0234]\b|internal server error|bad gateway|service unavailable"
    r"|gateway time-?out|connection (refused|reset|closed|timed out)|i/o timeout|timed out|timeout"
    r"|temporary failure|try again|no such host|network is unreachable|tls handshake|unexpected eof"
    r"|broken pipe)",
    re.IGNORECASE,
)
_CONFIG_TEXT: Final = re.compile(
    r"(missing required configuration|invalid config value|missing value for environment variable"
    r"|unreadable path|config key)",
    re.IGNORECASE,
)
_LOCK_OWNER: Final = re.compile(r"locked by (?P<owner>[^\n;]+?)(?:\s*$|[;\n])", re.MULTILINE)
_URN: Final = re.compile(r"urn:pulumi:[^\s,;'\"]+")

MESSAGE_LINES: Final = 10
MESSAGE_CHARS: Final = 2000


@dataclass(frozen=True, slots=True)
class Classification:
    """A failure's class, with what the error text says about locks and pending operations."""

    reason: FailureReason
    transient: bool
    lock_owner: str | None = None
    pending_operations: tuple[str, ...] = ()


def tail_lines(text: str | None, lines: int = MESSAGE_LINES, chars: int = MESSAGE_CHARS) -> str:
    """The last non-empty lines of an error (what ``kubectl describe`` should show)."""
    kept = [line.rstrip() for line in (text or "").splitlines() if line.strip()]
    out = "\n".join(kept[-lines:])
    return out if len(out) <= chars else "..." + out[-(chars - 3) :]


def classify_failure(update_reason: str | None, message: str | None) -> Classification:
    """Classify a failed Update from its ``Failed`` condition reason and its message."""
    text = message or ""
    reason = _REASONS.get(update_reason or "")
    if reason is None:
        if _TRANSIENT_TEXT.search(text):
            reason = "Transient"
        elif _CONFIG_TEXT.search(text):
            reason = "ConfigInvalid"
        else:
            reason = "OperationFailed"
    lock_owner = None
    if reason == "StackLocked":
        match = _LOCK_OWNER.search(text)
        lock_owner = match["owner"].strip() if match else None
    pending: tuple[str, ...] = ()
    if reason == "PendingOperations":
        pending = tuple(dict.fromkeys(_URN.findall(text)))
    return Classification(reason, reason in TRANSIENT_REASONS, lock_owner, pending)


def for_stack(spec: StackSpec, settings: RetrySettings) -> RetrySettings:
    """The operator's ``settings`` with the Stack's own values laid over them: each field the Stack
    omits is the operator's. ``retryMaxBackoffDurationSeconds: 0`` is omitted too (as in Go)."""
    policy = spec.retry_policy
    transient = policy.transient if policy else None
    deterministic = policy.deterministic if policy else None
    own: dict[str, Any] = {
        "max_update_failures": spec.max_update_failures,
        "max_backoff": spec.retry_max_backoff_duration_seconds or None,
        "transient_base": transient.base_seconds if transient else None,
        "transient_factor": transient.factor if transient else None,
        "transient_cap": transient.max_seconds if transient else None,
        "jitter": transient.jitter if transient else None,
        "deterministic_base": deterministic.base_seconds if deterministic else None,
        "deterministic_factor": deterministic.factor if deterministic else None,
    }
    return replace(settings, **{name: value for name, value in own.items() if value is not None})


def failure_budget(spec: StackSpec, settings: RetrySettings) -> int:
    """Retries allowed for deterministic failures: the Stack's ``maxUpdateFailures``, else the operator's.

    A preview-only Stack gets none: a preview that fails for a deterministic reason will fail the
    same way again, so it ends failed (Go operator issue 1070) until its spec or source changes.
    """
    return 0 if spec.preview else for_stack(spec, settings).max_update_failures


def jitter_fraction(seed: str, jitter: float) -> float:
    """A stable factor in ``[1 - jitter, 1 + jitter]`` for ``seed`` (e.g. the failed Update's name)."""
    digest = hashlib.sha256(seed.encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64
    return 1.0 - jitter + 2 * jitter * unit


def _grown(base: float, factor: float, failures: int, ceiling: float) -> float:
    """``base x factor^failures``, but no further than the first value at or above ``ceiling``
    (so no factor or failure count overflows)."""
    delay = base
    for _ in range(max(failures, 0)):
        if delay >= ceiling:
            break
        delay *= factor
    return delay


def transient_cap(settings: RetrySettings) -> float:
    """The longest transient wait: the transient cap, or the longest wait of any retry if lower."""
    return min(settings.transient_cap, settings.max_backoff)


def deterministic_delay(failures: int, settings: RetrySettings) -> float:
    """``deterministic_base x deterministic_factor^failures`` (the Go cooldown by default), capped
    at ``max_backoff`` (``failures`` counts from 0)."""
    cap = settings.max_backoff
    return min(_grown(settings.deterministic_base, settings.deterministic_factor, failures, cap), cap)


def transient_delay(failures: int, settings: RetrySettings, seed: str) -> float:
    """``transient_base x transient_factor^failures`` with stable jitter, capped after the jitter
    (a cap the user set is never exceeded)."""
    cap = transient_cap(settings)
    # Grown until even the lowest jitter keeps it at the cap, so capping matches the uncapped formula.
    delay = _grown(settings.transient_base, settings.transient_factor, failures, cap / (1 - settings.jitter))
    return min(delay * jitter_fraction(seed, settings.jitter), cap)


def retry_delay(
    *, transient: bool, failures: int, spec: StackSpec, settings: RetrySettings, seed: str
) -> float:
    """Whole seconds between a failure and its retry (status times have whole seconds), with the
    Stack's own settings over the operator's: at least 1, never beyond the cap that applies."""
    own = for_stack(spec, settings)
    if transient:
        delay, cap = transient_delay(failures, own, seed), transient_cap(own)
    else:
        delay, cap = deterministic_delay(failures, own), own.max_backoff
    return max(min(float(round(delay)), float(math.floor(cap))), 1.0)


def retry_at(last_attempt: datetime, delay: float) -> datetime:
    """When the retry is due, to the second (status times have second precision)."""
    return (last_attempt + timedelta(seconds=delay)).replace(microsecond=0)
