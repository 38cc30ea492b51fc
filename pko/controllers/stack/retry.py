"""Classified retries of failed Stack operations (pure): which failures are transient, and when to retry.

The Go operator retries every failure the same way (10 s x 3^failures, up to 24 h, at most 3
times), so a network blip can park a fleet for a day (its issue 1294) while a program error is
retried three times for nothing. Here a failure is first classified from the Update's ``Failed``
reason (the agent's closed set) and, for generic reasons, from the error text:

* transient (network, 5xx, 429, update conflict, a lock held by another run, a lost Update):
  retried after ``transient_base x 2^n`` seconds with +-``jitter``, capped at ``transient_cap``
  (and the Stack's ``retryMaxBackoffDurationSeconds``); never Stalls;
* deterministic (program, config, install or auth error, pending operations): the Go cooldown
  (``10 s x 3^n``, capped) and, after ``maxUpdateFailures`` retries, Stalled ``UpdateFailed``.

Jitter is derived from the Update's name, so the delay of one failure is the same at every
reconcile (no status churn) while a fleet that failed together spreads out.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from pko.api.stack import FailureReason, StackSpec
from pko.controllers.retrysettings import RetrySettings

__all__ = [
    "STALL_AT_ONCE",
    "Classification",
    "classify_failure",
    "deterministic_delay",
    "failure_budget",
    "jitter_fraction",
    "retry_delay",
    "tail_lines",
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
    "StackNotFound": "StackNotFound",
}
TRANSIENT_REASONS: Final[frozenset[FailureReason]] = frozenset(
    {"StackLocked", "UpdateConflict", "Transient", "UpdateLost"}
)
# Failures no retry can mend: only the user can (the Stack is Stalled at once).
STALL_AT_ONCE: Final[frozenset[FailureReason]] = frozenset({"StackNotFound"})

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


def failure_budget(spec: StackSpec, settings: RetrySettings) -> int:
    """Retries allowed for deterministic failures: the Stack's extension field, else the operator's.

    A preview-only Stack gets none: a preview that fails for a deterministic reason will fail the
    same way again, so it ends failed (Go operator issue 1070) until its spec or source changes.
    """
    if spec.preview:
        return 0
    if spec.max_update_failures is not None:
        return spec.max_update_failures
    return settings.max_update_failures


def _cap(spec: StackSpec, settings: RetrySettings) -> float:
    value = spec.retry_max_backoff_duration_seconds or 0
    return float(value) if value > 0 else settings.max_backoff


def jitter_fraction(seed: str, jitter: float) -> float:
    """A stable factor in ``[1 - jitter, 1 + jitter]`` for ``seed`` (e.g. the failed Update's name)."""
    digest = hashlib.sha256(seed.encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64
    return 1.0 - jitter + 2 * jitter * unit


def deterministic_delay(failures: int, spec: StackSpec, settings: RetrySettings) -> float:
    """The Go cooldown: ``base x factor^failures``, capped (``failures`` counts from 0)."""
    cap = _cap(spec, settings)
    delay = settings.deterministic_base
    for _ in range(max(failures, 0)):
        delay *= settings.deterministic_factor
        if delay >= cap:
            return cap
    return min(delay, cap)


def transient_delay(failures: int, spec: StackSpec, settings: RetrySettings, seed: str) -> float:
    """``base x factor^failures`` with stable jitter, capped by the transient cap and the Stack's cap
    (after the jitter: a cap the user set is never exceeded)."""
    cap = min(settings.transient_cap, _cap(spec, settings))
    delay = settings.transient_base * settings.transient_factor ** min(max(failures, 0), 30)
    return min(delay * jitter_fraction(seed, settings.jitter), cap)


def retry_delay(
    *, transient: bool, failures: int, spec: StackSpec, settings: RetrySettings, seed: str
) -> float:
    """Seconds between a failure and its retry."""
    if transient:
        return transient_delay(failures, spec, settings, seed)
    return deterministic_delay(failures, spec, settings)


def retry_at(last_attempt: datetime, delay: float) -> datetime:
    """When the retry is due, to the second (status times have second precision)."""
    return (last_attempt + timedelta(seconds=delay)).replace(microsecond=0)
