"""``retry``, ``refresh``, ``cancel``, ``approve`` (pure): what each may ask of the operator.

The operator takes one request from users: a new value of the ``pulumi.com/reconciliation-request``
annotation (README: When ``pulumi up`` runs). It starts an Update at once (``Sync request:
"<value>"``), and a new request resets the failure count and the backoff, also of a Stalled
Stack (README: Failures and retries). ``retry`` is exactly that, as ``kubectl annotate`` does it.

The others have no mechanism in the operator, and the plugin does not invent one; each command
fails with exit code 4 and says what does exist:

* ``refresh``: a Stack runs ``up`` (or ``preview``) and, when deleted, ``destroy``; never a
  ``refresh`` alone. ``spec.refresh: true`` refreshes before every ``up``.
* ``cancel``: deleting a running Update cancels its operation, but the Stack records that as a
  transient failure and starts a new Update about 5 s later; only ``spec.suspend: true`` keeps it
  from starting one.
* ``approve``: no approval gate exists yet (``status.plan`` and its digest annotation).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pko.kubectl.stackview import deleting, status_of, suspended

__all__ = [
    "RECONCILE_REQUEST_ANNOTATION",
    "approve_unsupported",
    "cancel_unsupported",
    "current_request",
    "refresh_unsupported",
    "retry_notes",
    "retry_value",
]

RECONCILE_REQUEST_ANNOTATION: Final = "pulumi.com/reconciliation-request"
"""Also pko.api.stack.RECONCILE_REQUEST_ANNOTATION (which loads pydantic); a test keeps them equal."""


def _names(stack: Mapping[str, Any]) -> tuple[str, str]:
    meta = stack.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("namespace", ""))


def current_request(stack: Mapping[str, Any]) -> str:
    meta = stack.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(RECONCILE_REQUEST_ANNOTATION) or "")


def retry_value(now: datetime, current: str) -> str:
    """A fresh request value: the time to the microsecond (readable in the Update's message
    ``Sync request: "..."``), never equal to ``current`` (an equal value requests nothing)."""
    value = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value if value != current else value + "-1"


def retry_notes(stack: Mapping[str, Any]) -> list[str]:
    """What the user should know after asking for a retry: when it will, or will not, run."""
    notes: list[str] = []
    current = (status_of(stack).get("currentUpdate") or {}).get("name")
    if current:
        notes.append(f"Update {current} is running: the retry starts once it ends.")
    if suspended(stack):
        notes.append("spec.suspend is set: nothing runs until it is cleared.")
    if deleting(stack):
        notes.append("The Stack is being deleted: the request retries its destroy.")
    return notes


def refresh_unsupported(stack: Mapping[str, Any]) -> str:
    name, namespace = _names(stack)
    retry = f"kubectl pko retry {name} -n {namespace}"
    base = (
        "refresh is not supported: the operator has no request for a one-off `pulumi refresh` of a "
        "Stack (a Stack runs up or preview, and destroy when deleted)."
    )
    if (stack.get("spec") or {}).get("refresh"):
        return f"{base} This Stack has spec.refresh: true, so every up refreshes first: {retry} runs one."
    patch = f"""kubectl patch stack {name} -n {namespace} --type=merge -p '{{"spec":{{"refresh":true}}}}'"""
    return f"{base} To refresh before every up, set spec.refresh: true ({patch}), then {retry}."


def cancel_unsupported(stack: Mapping[str, Any]) -> str:
    name, namespace = _names(stack)
    base = "cancel is not supported: the operator has no request to cancel a Stack's operation."
    current = (status_of(stack).get("currentUpdate") or {}).get("name")
    if not current:
        return f"{base} Stack {namespace}/{name} has no Update running."
    suspend = f"""kubectl patch stack {name} -n {namespace} --type=merge -p '{{"spec":{{"suspend":true}}}}'"""
    return (
        f"{base} Deleting the running Update (kubectl delete update {current} -n {namespace}) cancels "
        "its operation, but the Stack records that as a transient failure and starts a new Update "
        f"about 5 s later, unless spec.suspend is set first ({suspend})."
    )


def approve_unsupported(stack: Mapping[str, Any]) -> str:
    name, namespace = _names(stack)
    return (
        f"approve is not supported yet: the operator has no approval gate (no status.plan to approve "
        f"on Stack {namespace}/{name})."
    )
