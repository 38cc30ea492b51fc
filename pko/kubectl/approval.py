"""``kubectl pko approve`` (pure): which plan a Stack waits on, whether it may be approved, and how
it reads.

The operator (``spec.approval``, issue 29) previews an up first and records the plan in
``status.plan`` (``digest``, the preview ``update``, ``summary`` counts, ``time``), then waits with
Ready=False reason ``AwaitingApproval`` until the annotation ``pulumi.com/approved-plan`` holds
that digest. Approving is setting the annotation, which an admission policy lets only subjects
with the verb ``approve`` on stacks.pulumi.com do (config/admission).

The plugin approves only what a person can have reviewed: the plan recorded now, for the Stack's
current generation, while the Stack waits for it; else it refuses (exit 4) and writes nothing. The
digest itself is the operator's guard too: an approval of any other digest applies nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pko.api.stackterms import (
    APPROVED_PLAN_ANNOTATION,
    AWAITING_APPROVAL,
    CONDITION_READY,
    PLAN_OPS,
    resource_ops,
)
from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.kubectl.stackview import conditions, status_of, time_since
from pko.machinery.conditions import get_condition

__all__ = [
    "APPROVED_PLAN_ANNOTATION",
    "AWAITING_APPROVAL",
    "Plan",
    "approved_digest",
    "awaiting_approval",
    "change_lines",
    "check_approvable",
    "describe",
    "plan_of",
    "summary_text",
]

# How Pulumi marks each of the operator's per-resource plan operations (pko.api.stackterms.resource_ops).
_SYMBOLS: Final = {"create": "+", "update": "~", "delete": "-", "replace": "+-"}


@dataclass(frozen=True, slots=True)
class Plan:
    """``status.plan``: the digest to approve, the preview Update that saved it, its counts, when."""

    digest: str
    update: str
    summary: Mapping[str, int]
    time: str
    commit: str = ""


def _count(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def plan_of(stack: Mapping[str, Any]) -> Plan | None:
    """The recorded plan, or None (none recorded, or one without a digest: nothing to approve)."""
    plan = status_of(stack).get("plan")
    if not isinstance(plan, Mapping) or not plan.get("digest"):
        return None
    found = plan.get("summary")
    summary: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    return Plan(
        digest=str(plan["digest"]),
        update=str(plan.get("update") or ""),
        summary={op: _count(summary.get(op)) for op in PLAN_OPS},
        time=str(plan.get("time") or ""),
        commit=str(plan.get("commit") or ""),
    )


def summary_text(summary: Mapping[str, int]) -> str:
    """``1 to create, 2 to update, 0 to delete, 1 to replace`` (the operator's wording)."""
    return ", ".join(f"{_count(summary.get(op))} to {op}" for op in PLAN_OPS)


def approved_digest(stack: Mapping[str, Any]) -> str:
    """The annotation's value ("" when absent)."""
    annotations = (stack.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(APPROVED_PLAN_ANNOTATION) or "")


def awaiting_approval(stack: Mapping[str, Any]) -> bool:
    """Ready=False with reason AwaitingApproval."""
    ready = get_condition(conditions(stack), CONDITION_READY)
    return ready is not None and ready.get("status") == "False" and ready.get("reason") == AWAITING_APPROVAL


def change_lines(update: Mapping[str, Any] | None) -> list[str]:
    """The plan's preview Update's change set (``status.changes``), one line per resource the
    summary counts (the operator's rule, :func:`resource_ops`), marked as Pulumi marks it (``+``
    create, ``~`` update, ``-`` delete, ``+-`` replace), with the changed property paths."""
    changes = [c for c in status_of(update).get("changes") or [] if isinstance(c, Mapping)]
    types: dict[str, str] = {}
    paths: dict[str, list[str]] = {}
    for change in changes:
        urn = str(change.get("urn") or "")
        types[urn] = str(change.get("type") or "")
        paths.setdefault(urn, [])
        paths[urn] += [str(p) for p in change.get("paths") or [] if str(p) not in paths[urn]]
    lines: list[str] = []
    for urn, op in resource_ops(changes).items():
        name = urn.rsplit("::", 1)[-1]
        changed = f": {', '.join(paths[urn])}" if paths[urn] else ""
        lines.append(f"  {_SYMBOLS[op]:<2} {op:<7} {name} ({types[urn]}){changed}")
    status = status_of(update)
    if status.get("changesTruncated"):
        # The Update lists the first changes only (pko.api.limits); the plan's summary counts them all.
        lines.append(
            f"  ... the Update lists {len(changes)} of {status.get('changeCount')} changes "
            "(paths may be cut too): the workspace agent's log has a 'resource change' line for each"
        )
    return lines


def _names(stack: Mapping[str, Any]) -> tuple[str, str]:
    meta = stack.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("namespace", ""))


def describe(plan: Plan, now: datetime) -> str:
    """``Plan <digest> (preview Update <u>, recorded 5m ago): 1 to create, ...``."""
    ago = time_since(plan.time, now)
    where = f"preview Update {plan.update}" if plan.update else "no preview Update named"
    when = f", recorded {ago} ago" if ago else ""
    return f"Plan {plan.digest} ({where}{when}): {summary_text(plan.summary)}"


def check_approvable(stack: Mapping[str, Any], requested: str | None) -> Plan:
    """The plan to approve, or :class:`PluginError` (exit 4) saying why there is none.

    ``requested`` (``--digest``) must be the recorded plan's digest: the user approves what they
    reviewed, never a plan recorded since. An approval already in place is returned as is (the
    caller says so and writes nothing)."""
    name, namespace = _names(stack)
    where = f"Stack {namespace}/{name}"
    status_cmd = f"kubectl pko status {name} -n {namespace}"
    plan = plan_of(stack)
    if plan is None:
        ready = get_condition(conditions(stack), CONDITION_READY) or {}
        state = f" (Ready: {ready.get('status')}, {ready.get('reason')})" if ready else ""
        raise PluginError(
            ExitCode.REFUSED,
            f"{where} has no recorded plan (status.plan){state}: nothing to approve. A plan is "
            "recorded when spec.approval is set and an up is due.",
        )
    if requested is not None and requested != plan.digest:
        raise PluginError(
            ExitCode.REFUSED,
            f"--digest {requested} is not the plan {where} recorded ({plan.digest}): the plan changed "
            f"since it was reviewed; review it again ({status_cmd}).",
        )
    if approved_digest(stack) == plan.digest:
        return plan
    if not awaiting_approval(stack):
        ready = get_condition(conditions(stack), CONDITION_READY) or {}
        raise PluginError(
            ExitCode.REFUSED,
            f"{where} is not awaiting approval (Ready: {ready.get('status', 'Unknown')}, "
            f"{ready.get('reason') or 'no reason'}): its plan {plan.digest} is not waiting for one.",
        )
    generation = (stack.get("metadata") or {}).get("generation")
    observed = (get_condition(conditions(stack), CONDITION_READY) or {}).get("observedGeneration")
    if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
        raise PluginError(
            ExitCode.REFUSED,
            f"{where} changed (generation {generation}) since its plan was recorded (generation "
            f"{observed}): the operator previews again; approve the new plan once recorded ({status_cmd}).",
        )
    return plan
