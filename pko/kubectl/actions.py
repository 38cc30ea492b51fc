"""``retry``, ``refresh``, ``cancel`` (pure): the one-off requests a user makes of the operator,
each a fresh token in an annotation of the Stack, as ``kubectl annotate`` would set it.

* ``retry``: ``pulumi.com/reconciliation-request``. The operator starts an Update at once
  (``Sync request: "<token>"``), and a new request resets the failure count and the backoff, also
  of a Stalled Stack (docs/stacks.md: When ``pulumi up`` runs; docs/retries.md).
* ``refresh``: ``pulumi.com/refresh-request``. The operator runs one ``refresh`` (after the Update
  in flight, not while ``spec.suspend`` is set or the Stack is being deleted), retried after a
  transient failure, and records the token in ``status.observedRefreshRequest`` once the refresh
  succeeded or failed for good; ``status.lastRefresh`` says how the last one ended.
* ``cancel``: ``pulumi.com/cancel-request``. The operator records the token in
  ``status.observedCancelRequest`` at once and cancels the Update in flight (it marks it with
  ``currentUpdate.cancelRequest`` until it has ended, then records a ``Cancelled`` failure,
  which is not retried until the next change or request); with nothing in flight it cancels nothing.

A token is the time to the microsecond: readable, and never equal to the one in place (an equal
value requests nothing). ``--wait`` waits until the Stack's status says the request was carried out
(:func:`done`); :func:`outcome` says how it ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from pko.api.stackterms import (
    CANCEL_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    REFRESH_REQUEST_ANNOTATION,
)
from pko.kubectl.stackview import deleting, status_of, suspended

__all__ = [
    "CANCEL_REQUEST_ANNOTATION",
    "RECONCILE_REQUEST_ANNOTATION",
    "REFRESH_REQUEST_ANNOTATION",
    "REQUESTS",
    "Outcome",
    "Request",
    "annotation",
    "current_request",
    "done",
    "notes",
    "outcome",
    "refresh_retrying",
    "retry_notes",
    "retry_value",
]


@dataclass(frozen=True, slots=True)
class Request:
    """A one-off request: its annotation and the status field that records it carried out."""

    command: str
    annotation: str
    observed: str


REQUESTS: Final = {
    "retry": Request("retry", RECONCILE_REQUEST_ANNOTATION, "observedReconcileRequest"),
    "refresh": Request("refresh", REFRESH_REQUEST_ANNOTATION, "observedRefreshRequest"),
    "cancel": Request("cancel", CANCEL_REQUEST_ANNOTATION, "observedCancelRequest"),
}


def annotation(stack: Mapping[str, Any], key: str) -> str:
    meta = stack.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(key) or "")


def current_request(stack: Mapping[str, Any]) -> str:
    return annotation(stack, RECONCILE_REQUEST_ANNOTATION)


def retry_value(now: datetime, current: str) -> str:
    """A fresh request token: the time to the microsecond (readable in the Update's message
    ``Sync request: "..."``), never equal to ``current`` (an equal value requests nothing)."""
    value = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value if value != current else value + "-1"


def _running(stack: Mapping[str, Any]) -> str:
    return str((status_of(stack).get("currentUpdate") or {}).get("name") or "")


def retry_notes(stack: Mapping[str, Any]) -> list[str]:
    """What the user should know after asking for a retry: when it will, or will not, run."""
    notes: list[str] = []
    if _running(stack):
        notes.append(f"Update {_running(stack)} is running: the retry starts once it ends.")
    if suspended(stack):
        notes.append("spec.suspend is set: nothing runs until it is cleared.")
    if deleting(stack):
        notes.append("The Stack is being deleted: the request retries its destroy.")
    return notes


def notes(command: str, stack: Mapping[str, Any]) -> list[str]:
    """What the user should know after a request: when it will, or will not, be carried out."""
    if command == "retry":
        return retry_notes(stack)
    running = _running(stack)
    if command == "refresh":
        found: list[str] = []
        if deleting(stack):
            found.append("The Stack is being deleted: no refresh runs.")
        elif suspended(stack):
            found.append("spec.suspend is set: the refresh runs once it is cleared.")
        elif running:
            found.append(f"Update {running} is running: the refresh starts once it ends.")
        return found
    if not running:
        return ["No Update is running: the operator records the request and cancels nothing."]
    return []


def refresh_retrying(stack: Mapping[str, Any], token: str) -> str:
    """How the refresh for ``token`` is being retried after a transient failure ("" when it is not):
    the request stays pending meanwhile."""
    status = status_of(stack)
    last = status.get("lastRefresh") or {}
    pending = status.get("observedRefreshRequest") != token and last.get("token") == token
    if not pending or last.get("state") != "failed":
        return ""
    reason = last.get("reason") or "Transient"
    said = f"failed {last.get('failures') or 1} time(s) for a transient cause ({reason})"
    if last.get("message"):
        said += f": {' '.join(str(last['message']).split())[-300:]}"
    return said + "; the operator retries it"


def done(command: str, stack: Mapping[str, Any], token: str) -> bool:
    """Whether the operator has carried out the request ``token``: recorded it, and for a cancel
    also seen the cancelled Update end."""
    status = status_of(stack)
    if status.get(REQUESTS[command].observed) != token:
        return False
    if command == "cancel":
        return (status.get("currentUpdate") or {}).get("cancelRequest") != token
    return True


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a carried-out request ended, for a person; ``failed``: the operation it ran failed."""

    text: str
    failed: bool = False


def outcome(command: str, stack: Mapping[str, Any], token: str, before: Mapping[str, Any]) -> Outcome:
    """What ``--wait`` reports once :func:`done`: the refresh's Update and result, or what became
    of the Update that was running when the cancel was requested (``before``: the Stack as read
    then)."""
    status = status_of(stack)
    last = status.get("lastUpdate") or {}
    if command == "refresh":
        refreshed = status.get("lastRefresh") or {}
        if refreshed.get("token") != token:  # an operator that does not record it
            return Outcome(f"refresh {token} done.")
        state = str(refreshed.get("state") or "")
        text = f"refresh {token} done: Update {refreshed.get('name')} {state or 'ended'}."
        if state == "failed" and refreshed.get("message"):
            text += f" {' '.join(str(refreshed['message']).split())[-300:]}"
        return Outcome(text, failed=state == "failed")
    if command == "cancel":
        running = _running(before)
        if not running:
            return Outcome(f"cancel {token} done: no Update was running.")
        failure = status.get("lastFailure") or {}
        if failure.get("reason") == "Cancelled" and failure.get("updateName") in (None, running):
            return Outcome(f"cancel {token} done: Update {running} cancelled.")
        if last.get("name") == running:
            return Outcome(f"cancel {token} done: Update {running} had ended ({last.get('state')}) first.")
        return Outcome(f"cancel {token} done: Update {running} is no longer running.")
    return Outcome(f"{command} {token} done.")
