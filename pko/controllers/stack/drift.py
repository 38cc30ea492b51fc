"""Drift detection on a Stack (``spec.driftDetection``, issue 29), pure.

Every ``intervalSeconds`` the Stack runs a ``refresh`` Update with ``previewOnly`` (the engine
reads each resource back and writes nothing) and records its change set in ``status.drift``: each
drifted resource by URN with the property paths that differ, and ``firstSeen``, the first check
that found it (kept while it stays drifted). The ``Drifted`` condition follows the last check;
``DriftDetected`` and ``DriftCleared`` Events mark its changes. The next check is due
``intervalSeconds`` after the last, or at once after an up that ran since drift was found (it
says whether the up put things right). With ``remediate`` a found drift makes an up due (with
refresh, so the engine sees what changed; through the approval gate when one is set).

Checks never mark the Stack Reconciling: a periodic read must not flap Ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pko.api.limits import MAX_SHORT_MESSAGE_CHARS
from pko.api.stack import DriftDetectionSpec
from pko.controllers.bounds import bounded_list, cap_head
from pko.controllers.stack.status import parse_time
from pko.machinery.conditions import format_time, remove_condition, set_condition
from pko.machinery.events import Emit

__all__ = [
    "DRIFTED",
    "DriftResult",
    "drift_due_in",
    "drift_message",
    "mark_drift",
    "record_drift",
    "record_drift_failure",
    "remediation_due",
]

Obj = dict[str, Any]

DRIFTED: Final = "Drifted"
_SHOWN: Final = 5  # URNs named in a message


def _up_since_check(status: Mapping[str, Any]) -> bool:
    """An up was recorded at or after the last check (it may have changed what drifted)."""
    last = status.get("lastUpdate") or {}
    checked = parse_time((status.get("drift") or {}).get("lastCheckTime"))
    ran = parse_time(last.get("lastResyncTime"))
    return last.get("type") == "up" and checked is not None and ran is not None and ran >= checked


def _deployed(status: Mapping[str, Any]) -> bool:
    return bool((status.get("lastUpdate") or {}).get("lastSuccessfulCommit")) or bool(
        (status.get("lastUpdate") or {}).get("state") == "succeeded"
    )


def drift_due_in(spec: DriftDetectionSpec | None, status: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds until the next drift check is due (0: now); None without drift detection or before
    anything was deployed (there is nothing to drift)."""
    if spec is None or not _deployed(status):
        return None
    drift = status.get("drift") or {}
    checked = parse_time(drift.get("lastCheckTime"))
    if checked is None:
        return 0.0
    if drift.get("detected") and _up_since_check(status):
        return 0.0
    return max(0.0, (checked - now).total_seconds() + spec.interval_seconds)


def remediation_due(spec: DriftDetectionSpec | None, status: Mapping[str, Any]) -> bool:
    """``remediate`` is set, the last check found drift, and no up has run since."""
    if spec is None or not spec.remediate:
        return False
    return bool((status.get("drift") or {}).get("detected")) and not _up_since_check(status)


def drift_message(resources: list[Obj], count: int | None = None) -> str:
    """The ``Drifted`` condition's and Event's message: how many differ (``count``: all of them, when
    ``resources`` lists only the first), the first few by URN and path; at most
    ``MAX_SHORT_MESSAGE_CHARS``."""
    total = max(count or 0, len(resources))
    if not total:
        return "no resource differs from the stack's state"
    shown = ", ".join(
        f"{r['urn']}" + (f" ({', '.join(r.get('paths') or [])})" if r.get("paths") else " (gone)")
        for r in resources[:_SHOWN]
    )
    listed = min(len(resources), _SHOWN)
    more = f" and {total - listed} more" if total > listed else ""
    return cap_head(
        f"{total} resource(s) differ from the stack's state: {shown}{more}", MAX_SHORT_MESSAGE_CHARS
    )


def mark_drift(status: Obj, detected: bool, message: str, generation: int | None, now: datetime) -> None:
    status["conditions"] = set_condition(
        list(status.get("conditions") or []),
        DRIFTED,
        "True" if detected else "False",
        "DriftDetected" if detected else "NoDrift",
        message,
        generation,
        now,
    )


@dataclass(frozen=True, slots=True)
class DriftResult:
    """What a check found: the resources drifted, and the Events that mark a change."""

    resources: list[Obj]
    events: list[Emit]


def record_drift(
    status: Obj, update: Mapping[str, Any], generation: int | None, now: datetime
) -> DriftResult:
    """Record a succeeded drift check (a ``previewOnly`` refresh Update) in ``status.drift`` and
    the ``Drifted`` condition: the first drifted resources (bounded), and how many there are (the
    Update's ``changeCount`` when it lists only some)."""
    before = status.get("drift") or {}
    recorded = update.get("status") or {}
    seen = {str(r.get("urn")): r.get("firstSeen") for r in before.get("resources") or []}
    by_urn: dict[str, Obj] = {}
    for change in recorded.get("changes") or []:
        urn = str(change.get("urn") or "")
        if not urn or str(change.get("op") or "") == "same":
            continue
        entry = by_urn.setdefault(
            urn,
            {
                "urn": urn,
                "type": str(change.get("type") or ""),
                "firstSeen": seen.get(urn) or format_time(now),
            },
        )
        paths = sorted({*entry.get("paths", []), *(str(p) for p in change.get("paths") or [])})
        if paths:
            entry["paths"] = paths
    listed = bounded_list(by_urn[urn] for urn in sorted(by_urn))
    resources = listed.entries
    partial = bool(recorded.get("changesTruncated")) or listed.truncated
    count = max(int(recorded.get("changeCount") or 0), listed.total) if partial else listed.total
    detected = count > 0
    drift: Obj = {"lastCheckTime": format_time(now), "detected": detected}
    if resources:
        drift["resources"] = resources
    if detected:
        drift["count"] = count
    if partial:
        drift["truncated"] = True
    status["drift"] = drift
    message = drift_message(resources, count)
    mark_drift(status, detected, message, generation, now)
    events: list[Emit] = []
    if detected and not before.get("detected"):
        events.append(Emit("Warning", "DriftDetected", message))
    elif not detected and before.get("detected"):
        events.append(Emit("Normal", "DriftCleared", "the drift check found no resource differing"))
    return DriftResult(resources, events)


def record_drift_failure(status: Obj, update: Mapping[str, Any], now: datetime) -> Emit:
    """A drift check that failed: its time and error are recorded, what was found before stays."""
    message = str((update.get("status") or {}).get("message") or "the drift check failed")
    drift = dict(status.get("drift") or {})
    drift["lastCheckTime"] = format_time(now)
    drift["message"] = message.strip().splitlines()[-1] if message.strip() else message
    drift.setdefault("detected", False)
    status["drift"] = drift
    return Emit("Warning", "DriftCheckFailed", message)


def clear_drift(status: Obj) -> None:
    """Drift detection is off: nothing about drift is reported."""
    status.pop("drift", None)
    status["conditions"] = remove_condition(list(status.get("conditions") or []), DRIFTED)
