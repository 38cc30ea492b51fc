"""Refresh on request (``pulumi.com/refresh-request``, pure): when the requested refresh runs, and
what its end records.

A request is a user's, so a cause that goes away by itself must not drop it. The invariants:

* ``status.observedRefreshRequest`` is a token whose refresh ended for good: it succeeded, failed
  for a cause only the user can fix (a program error, bad config), or was cancelled on request;
* ``status.lastRefresh`` is the last refresh run on request: its Update, token, state, the tail of
  its error, its failure class and how many of this token's refreshes failed in a row;
* a token that is neither observed nor the one ``lastRefresh`` failed for runs at once; one whose
  refresh failed transiently runs again after the Stack's transient backoff
  (:func:`pko.controllers.stack.retry.retry_delay`, the Stack's ``spec.retryPolicy`` over the
  operator's, seeded by the failed Update's name as for ups), counted from ``lastRefresh``, so
  whatever wakes the Stack before then starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pko.api.stack import StackSpec
from pko.controllers.resources import REFRESH_REQUEST_ANNOTATION
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.kinds import REFRESH
from pko.controllers.stack.retry import classify_failure, retry_at, retry_delay, tail_lines
from pko.controllers.stack.status import FAILED, SUCCEEDED, parse_time, resources_after
from pko.controllers.stack.updateobject import Run
from pko.machinery.conditions import format_time, get_condition, is_true
from pko.machinery.events import Emit
from pko.machinery.resource import Obj

__all__ = [
    "RefreshWait",
    "record_refresh",
    "requested_refresh",
    "retrying_message",
]


@dataclass(frozen=True, slots=True)
class RefreshWait:
    """A requested refresh that failed ``failures`` times in a row for a transient cause: it runs
    again at ``at``, ``after`` seconds from now."""

    token: str
    failures: int
    at: datetime
    after: float


def _token(obj: Obj) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(REFRESH_REQUEST_ANNOTATION) or "")


def requested_refresh(
    obj: Obj, spec: StackSpec, status: Obj, settings: RetrySettings, now: datetime
) -> Run | RefreshWait | None:
    """The ``refresh`` to run for the Stack's ``pulumi.com/refresh-request`` token, or the wait
    before it runs again after a transient failure; None when the token ended for good."""
    token = _token(obj)
    if not token or token == status.get("observedRefreshRequest"):
        return None
    last = status.get("lastRefresh") or {}
    failures = int(last.get("failures") or 0) if last.get("token") == token else 0
    ended = parse_time(last.get("lastResyncTime"))
    if last.get("state") == FAILED and failures > 0 and ended is not None:
        seed = str(last.get("name") or token)
        delay = retry_delay(transient=True, failures=failures - 1, spec=spec, settings=settings, seed=seed)
        at = retry_at(ended, delay)
        if now < at:
            return RefreshWait(token, failures, at, max(1.0, (at - now).total_seconds()))
    message = f'Refresh request: "{token}"' + (f" (attempt {failures + 1})" if failures else "")
    return Run(REFRESH, message, annotations={REFRESH_REQUEST_ANNOTATION: token})


def retrying_message(wait: RefreshWait) -> str:
    """The Reconciling message while a refresh request waits for its retry."""
    return (
        f'refresh request "{wait.token}" failed {wait.failures} time(s) for a transient cause; '
        f"retrying at {format_time(wait.at)}"
    )


def record_refresh(status: Obj, update: Obj, now: datetime, *, cancel_request: str | None) -> list[Emit]:
    """Record a completed refresh run on request in ``lastRefresh``, and its token as observed
    unless a transient failure keeps the request pending (``cancel_request``: the token that
    cancelled it, which ends the request); the Event that says so."""
    upd_status = update.get("status") or {}
    token = _token(update)
    conditions = upd_status.get("conditions")
    error = str(upd_status.get("message") or "")
    if not is_true(conditions, "Failed"):
        count = resources_after(update)
        if count is not None:
            status["resourceCount"] = count
        if token:
            status["lastRefresh"] = {**_ran(update, token, now), "state": SUCCEEDED, "failures": 0}
            status["observedRefreshRequest"] = token
        return [Emit("Normal", "StackRefreshed", "Successfully refreshed stack")]
    if not token:  # not run on request (none such is created): reported, not recorded
        return [Emit("Warning", "StackRefreshFailed", f"refresh failed: {error}")]
    if cancel_request:
        reason, transient, message = "Cancelled", False, f"cancelled on request {cancel_request!r}"
    else:
        reason_of = (get_condition(conditions, "Failed") or {}).get("reason")
        kind = classify_failure(str(reason_of) if reason_of else None, error)
        reason, transient, message = kind.reason, kind.transient, tail_lines(error) or kind.reason
    last = status.get("lastRefresh") or {}
    before = int(last.get("failures") or 0) if last.get("token") == token else 0
    status["lastRefresh"] = {
        **_ran(update, token, now),
        "state": FAILED,
        "message": message,
        "reason": reason,
        "failures": before + 1,
    }
    if transient:
        said = f"refresh failed for a transient cause ({reason}); the request stays pending, retried: {error}"
        return [Emit("Warning", "StackRefreshFailed", said)]
    status["observedRefreshRequest"] = token
    return [Emit("Warning", "StackRefreshFailed", f"refresh failed: {error}")]


def _ran(update: Obj, token: str, now: datetime) -> Obj:
    name = (update.get("metadata") or {}).get("name")
    return {"name": name, "token": token, "lastResyncTime": format_time(now)}
