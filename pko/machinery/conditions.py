"""Status conditions (``metav1.Condition``) as plain dicts: apimachinery's ``meta`` helpers.

Pure functions returning new lists, so a reconciler can build the status it applies from the
cached object without mutating the cache. ``lastTransitionTime`` changes only when ``status``
does: it says since when a condition holds, which is what users (and ``kubectl wait``) read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # at run time the kubectl plugin's one file imports this module without aiohttp
    from pko.machinery.resource import Obj

__all__ = [
    "ConditionStatus",
    "format_time",
    "get_condition",
    "is_false",
    "is_true",
    "parse_time",
    "remove_condition",
    "set_condition",
]

ConditionStatus = Literal["True", "False", "Unknown"]


def format_time(when: datetime | None = None) -> str:
    """RFC 3339 in UTC with second precision, as ``metav1.Time`` serializes (default: now)."""
    when = datetime.now(UTC) if when is None else when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> datetime | None:
    """A ``metav1.Time`` as the API serializes it (``...Z``), or None when absent or malformed."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def get_condition(conditions: list[Obj] | None, type_: str) -> Obj | None:
    for condition in conditions or []:
        if condition.get("type") == type_:
            return condition
    return None


def set_condition(
    conditions: list[Obj] | None,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime | None = None,
) -> list[Obj]:
    """A new list with condition ``type_`` set (appended if new, else replaced in place).

    ``lastTransitionTime`` is kept when the status is unchanged, else set to ``now``.
    ``observed_generation=None`` leaves the field out.
    """
    old = get_condition(conditions, type_)
    transition = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    new: Obj = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition or format_time(now),
    }
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    result = [dict(c) for c in conditions or []]
    for i, condition in enumerate(result):
        if condition.get("type") == type_:
            result[i] = new
            return result
    result.append(new)
    return result


def remove_condition(conditions: list[Obj] | None, type_: str) -> list[Obj]:
    return [dict(c) for c in conditions or [] if c.get("type") != type_]


def is_true(conditions: list[Obj] | None, type_: str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.get("status") == "True"


def is_false(conditions: list[Obj] | None, type_: str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.get("status") == "False"
