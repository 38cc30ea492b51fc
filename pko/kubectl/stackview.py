"""Reading a Stack as the commands show it (pure): its readiness, times, and outputs with secrets masked.

One reading of the conditions for every command, so ``status`` and ``why`` never disagree on
whether a Stack is Ready (and so exit 0 or 1 alike). The rules are the operator's
(``pko.controllers.stack.status``): ``Stalled`` and ``Reconciling`` never hold together and
``Ready=True`` removes both; a ``Ready=True`` written for an older generation is not Ready for
this one (the operator has not looked at the change yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pko.api.stackterms import (
    AWAITING_APPROVAL,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    CONDITION_SUSPENDED,
)
from pko.machinery.conditions import get_condition, parse_time

__all__ = [
    "AWAITING_APPROVAL",
    "SECRET_MASK",
    "Obj",
    "Readiness",
    "age",
    "conditions",
    "deleting",
    "masked",
    "parse_time",
    "qualified",
    "readiness",
    "status_of",
    "suspended",
    "time_since",
    "time_until",
]

Obj = dict[str, Any]

SECRET_MASK: Final = "[secret]"
"""What the operator writes for a secret output (``status.outputs``), and what the plugin shows."""
# A Pulumi secret value in its wire form: {SIG_KEY: SECRET_SIG, "value": ...}.
_SIG_KEY: Final = "4dabf18193072939515e22adb298388d"
_SECRET_SIG: Final = "1b47061264138c4ac30d75fd1eb44270"


@dataclass(frozen=True, slots=True)
class Readiness:
    """``state`` is one of ``Ready``, ``Reconciling``, ``Stalled``, ``Suspended``,
    ``AwaitingApproval`` (a plan waits for a person), ``NotReady``, ``Pending`` (the operator has
    not reported on this generation); ``reason`` and ``message``
    are those of the condition that decided it."""

    ready: bool
    state: str
    reason: str
    message: str


def status_of(obj: Mapping[str, Any] | None) -> Obj:
    return dict((obj or {}).get("status") or {})


def conditions(obj: Mapping[str, Any] | None) -> list[Obj]:
    return list(status_of(obj).get("conditions") or [])


def qualified(obj: Mapping[str, Any]) -> str:
    """``namespace/name``."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def suspended(stack: Mapping[str, Any]) -> bool:
    return bool((stack.get("spec") or {}).get("suspend"))


def _is(condition: Obj | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def readiness(stack: Mapping[str, Any]) -> Readiness:
    """Whether the Stack is Ready for its current generation, and the condition that says why not."""
    conds = conditions(stack)
    for type_ in (CONDITION_STALLED, CONDITION_RECONCILING):
        found = get_condition(conds, type_)
        if found is not None and _is(found):
            return Readiness(False, type_, str(found.get("reason") or ""), str(found.get("message") or ""))
    ready = get_condition(conds, CONDITION_READY)
    if ready is None:
        return Readiness(False, "Pending", "NotObserved", "the operator has not reported on this Stack yet")
    reason, message = str(ready.get("reason") or ""), str(ready.get("message") or "")
    if _is(ready):
        generation = (stack.get("metadata") or {}).get("generation")
        observed = ready.get("observedGeneration", status_of(stack).get("observedGeneration"))
        if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
            return Readiness(
                False,
                "Pending",
                "GenerationNotObserved",
                f"generation {generation} is not processed yet (Ready was for generation {observed})",
            )
        return Readiness(True, "Ready", reason, message)
    if _is(get_condition(conds, CONDITION_SUSPENDED)):
        return Readiness(False, "Suspended", reason or "Suspended", message)
    if reason == AWAITING_APPROVAL:
        return Readiness(False, AWAITING_APPROVAL, reason, message)
    return Readiness(False, "NotReady", reason, message)


def age(seconds: float) -> str:
    """A duration as kubectl prints ages: ``45s``, ``3m20s``, ``12m``, ``5h30m``, ``30h``, ``4d``."""
    total = max(int(seconds), 0)
    minutes, hours, days = total // 60, total // 3600, total // 86400
    if total < 120:
        return f"{total}s"
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    return f"{days}d"


def time_since(text: Any, now: datetime) -> str:
    """``age`` since a status time ("" when there is none)."""
    when = parse_time(text)
    return age((now - when).total_seconds()) if when else ""


def time_until(text: Any, now: datetime) -> str:
    """``in 1m30s`` until a status time, ``now`` once it has passed ("" when there is none)."""
    when = parse_time(text)
    if when is None:
        return ""
    seconds = (when - now).total_seconds()
    return f"in {age(seconds)}" if seconds >= 1 else "now"


def masked(value: Any) -> Any:
    """``value`` with every Pulumi secret replaced by ``[secret]``: the operator already masks
    secret outputs in ``status.outputs``; a value in Pulumi's secret wire form, wherever it
    appears (a status written by another tool), is masked here too, so the plugin never prints one."""
    if isinstance(value, Mapping):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            return SECRET_MASK
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value
