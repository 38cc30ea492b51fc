"""The Stack's Events for the policy violations an ended Update recorded (pure): one Warning per
violated policy (pack, policy, enforcement level), naming the resources and the policy's message, so
``kubectl describe stack`` and an alert on Events say which rule which resource broke.

The Update's ``status.policyViolations`` is bounded (:mod:`pko.api.limits`); so is each message here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pko.api.limits import MAX_SHORT_MESSAGE_CHARS
from pko.api.stackterms import POLICY_VIOLATION
from pko.controllers.bounds import cap_head
from pko.machinery.events import Emit

__all__ = ["policy_violation_events"]

_RESOURCES_NAMED: Final = 5


def _said(violation: Mapping[str, Any]) -> str:
    """The policy's own message: the last line of what the engine reports (its first is the
    policy's description, the same for every violation)."""
    lines = [line for line in str(violation.get("message") or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _one(violation: Mapping[str, Any]) -> str:
    where, said = str(violation.get("urn") or "the stack"), _said(violation)
    return f"{where}: {said}" if said else where


def policy_violation_events(update: Mapping[str, Any]) -> list[Emit]:
    """One Warning Event (reason PolicyViolation) per violated policy of ``update``, mandatory ones
    first, in the order the Update lists them."""
    violations = (update.get("status") or {}).get("policyViolations") or []
    grouped: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    for violation in violations:
        key = (
            str(violation.get("policyPack") or ""),
            str(violation.get("policyPackVersion") or ""),
            str(violation.get("policy") or ""),
            str(violation.get("enforcementLevel") or ""),
        )
        grouped.setdefault(key, []).append(violation)
    events: list[Emit] = []
    for (pack, version, policy, level), found in grouped.items():
        named = "; ".join(_one(v) for v in found[:_RESOURCES_NAMED])
        more = f" (and {len(found) - _RESOURCES_NAMED} more)" if len(found) > _RESOURCES_NAMED else ""
        where = f"{pack}@{version}" if version else pack
        outcome = "the update was refused" if level == "mandatory" else "reported"
        message = f"policy {policy} of pack {where} ({level}, {outcome}): {named}{more}"
        events.append(Emit("Warning", POLICY_VIOLATION, cap_head(message, MAX_SHORT_MESSAGE_CHARS)))
    return events
