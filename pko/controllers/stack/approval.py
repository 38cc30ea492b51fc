"""The approval gate of a Stack's ups (``spec.approval``, issue 29), pure.

An up that may need approval runs as two Updates: a ``preview`` with ``savePlan`` whose change set
the Stack records in ``status.plan`` under a digest, then an ``up`` whose ``spec.plan`` names that
preview, so the engine applies the plan and nothing else (anything else fails ``PlanMismatch``).
Between the two the Stack waits (Ready=False ``AwaitingApproval``) until the
``pulumi.com/approved-plan`` annotation holds the recorded digest; ``OnDestructive`` applies a
plan that deletes and replaces nothing at once, and a plan that changes no resource is applied
at once in either mode.

Invariants:

* an up runs only for a recorded plan whose ``inputs`` (revision, config, environment: the
  digest of :func:`plan_inputs`) equal the current ones; when they moved, the Stack previews again
  and waits again;
* a plan applies once: ``status.plan`` is dropped when its up ends, whatever the end, and the
  digest covers the preview Update that saved it and the Update the stack's state last came
  from (``base``), so a new preview (after ``PlanMismatch`` or ``PlanNotFound`` too) has a new
  digest and needs a new approval, even for the same change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pko.api.stackterms import (
    APPROVED_PLAN_ANNOTATION,
    AWAITING_APPROVAL,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    PLAN_OPS,
    resource_ops,
)
from pko.machinery.conditions import format_time, remove_condition, set_condition

__all__ = [
    "AWAITING_APPROVAL",
    "PLAN_INPUTS_ANNOTATION",
    "Apply",
    "Preview",
    "Wait",
    "canonical_json",
    "destructive",
    "gate",
    "mark_awaiting_approval",
    "plan_digest",
    "plan_inputs",
    "plan_recorded_message",
    "record_plan",
    "resource_ops",
    "summarize",
]

Obj = dict[str, Any]

PLAN_INPUTS_ANNOTATION: Final = "pulumi.com/plan-inputs"
"""On a plan's preview Update: the digest of the inputs it previewed (:func:`plan_inputs`)."""

# The Stack fields that decide what an up does, besides the program at the revision.
_INPUT_FIELDS: Final = (
    "stack",
    "config",
    "configRef",
    "secrets",
    "secretsRef",
    "secretsProvider",
    "envRefs",
    "envs",
    "envSecrets",
    "environment",
    "targets",
    "targetDependents",
)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept (what the digests hash)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha256(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


def plan_inputs(spec: Mapping[str, Any], commit: str, *, refresh: bool) -> str:
    """The digest of what an up runs with: the source revision, the config and environment
    fields of ``spec`` (the Stack's wire spec) and whether it refreshes first."""
    fields = {k: spec[k] for k in _INPUT_FIELDS if spec.get(k) not in (None, "", [], {})}
    return _sha256({"revision": commit, "spec": fields, "refresh": refresh})


def _change_entries(changes: Iterable[Mapping[str, Any]]) -> list[Obj]:
    entries = [
        {
            "urn": str(c.get("urn") or ""),
            "type": str(c.get("type") or ""),
            "op": str(c.get("op") or ""),
            "paths": sorted(str(p) for p in c.get("paths") or []),
        }
        for c in changes
    ]
    return sorted(entries, key=lambda e: (e["urn"], e["op"]))


def plan_digest(
    inputs: str,
    base: str,
    changes: Iterable[Mapping[str, Any]],
    preview: str = "",
    whole: Mapping[str, Any] | None = None,
) -> str:
    """The digest a user approves: the inputs, the Update the state came from, the change set and
    the ``preview`` Update that saved the plan (so each preview needs its own approval). For a
    change set the Update lists only in part (``changesTruncated``), ``whole`` (its count and
    summary) is hashed too; the preview's name already ties the digest to the one plan it saved."""
    value: Obj = {"inputs": inputs, "base": base, "preview": preview, "changes": _change_entries(changes)}
    if whole:
        value["whole"] = dict(whole)
    return _sha256(value)


def summarize(changes: Iterable[Mapping[str, Any]]) -> Obj:
    """The user's resources counted by what the plan does to them (:func:`resource_ops`)."""
    summary = dict.fromkeys(PLAN_OPS, 0)
    for op in resource_ops(changes).values():
        summary[op] += 1
    return summary


def destructive(summary: Mapping[str, Any]) -> bool:
    """Whether a plan deletes or replaces anything."""
    return int(summary.get("delete") or 0) > 0 or int(summary.get("replace") or 0) > 0


def _summary_text(summary: Mapping[str, Any]) -> str:
    return ", ".join(f"{int(summary.get(k) or 0)} to {k}" for k in PLAN_OPS)


def record_plan(status: Obj, update: Mapping[str, Any], now: datetime, commit: str) -> Obj:
    """Record the plan a succeeded preview Update saved in ``status.plan`` (digest over the inputs
    it previewed, the Update the state came from, its change set and its name); the plan as
    recorded."""
    meta = update.get("metadata") or {}
    inputs = str((meta.get("annotations") or {}).get(PLAN_INPUTS_ANNOTATION) or "")
    recorded = update.get("status") or {}
    changes = list(recorded.get("changes") or [])
    base = str((status.get("lastUpdate") or {}).get("name") or "")
    # Counted over every change by the Update controller (changes may list only the first).
    summary = dict(recorded.get("changeSummary") or summarize(changes))
    whole = (
        {"count": recorded.get("changeCount"), "summary": summary}
        if recorded.get("changesTruncated")
        else None
    )
    plan: Obj = {
        "digest": plan_digest(inputs, base, changes, str(meta.get("name") or ""), whole),
        "update": str(meta.get("name") or ""),
        "summary": summary,
        "time": format_time(now),
        "inputs": inputs,
    }
    if commit:
        plan["commit"] = commit
    status["plan"] = plan
    return plan


def approve_command(name: str, namespace: str, digest: str) -> str:
    return f"kubectl annotate stack {name} -n {namespace} --overwrite {APPROVED_PLAN_ANNOTATION}={digest}"


def plan_recorded_message(plan: Mapping[str, Any], name: str, namespace: str) -> str:
    """The Event and condition message of a plan waiting: its summary, how to approve it."""
    digest = str(plan.get("digest") or "")
    return (
        f"plan {digest} ({_summary_text(plan.get('summary') or {})}) from preview "
        f"{plan.get('update')} awaits approval: {approve_command(name, namespace, digest)}"
    )


@dataclass(frozen=True, slots=True)
class Preview:
    """Preview and save a plan first (none is recorded, or it is for other inputs)."""

    message: str


@dataclass(frozen=True, slots=True)
class Apply:
    """Run the up with the recorded plan of the preview Update ``plan``."""

    plan: str
    digest: str
    message: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing may run until a person approves the recorded plan."""

    message: str


def gate(
    mode: str, plan: Mapping[str, Any] | None, approved: str, inputs: str, name: str, namespace: str
) -> Preview | Apply | Wait:
    """What an up that is due does under approval ``mode`` (Always or OnDestructive), given the
    recorded ``plan``, the ``approved`` digest (the annotation, "" when absent) and the digest of
    the current ``inputs``."""
    if not plan:
        return Preview("Previewing a plan for approval")
    if plan.get("inputs") != inputs:
        return Preview("The revision or config changed since the plan was recorded: previewing again")
    digest = str(plan.get("digest") or "")
    summary = plan.get("summary") or {}
    if not any(int(summary.get(k) or 0) for k in PLAN_OPS):
        # Nothing of the user's changes (the engine refuses any change the plan lacks): no one
        # is asked to approve nothing at every resync.
        return Apply(str(plan.get("update")), digest, f"Applying plan {digest}: it changes no resource")
    if mode == "OnDestructive" and not destructive(summary):
        return Apply(
            str(plan.get("update")), digest, f"Applying plan {digest}: nothing is deleted or replaced"
        )
    if approved and approved == digest:
        return Apply(str(plan.get("update")), digest, f"Applying approved plan {digest}")
    waiting = plan_recorded_message(plan, name, namespace)
    if approved:
        return Wait(f"the approved digest {approved} is not the recorded plan's {digest}; {waiting}")
    return Wait(waiting)


def mark_awaiting_approval(status: Obj, message: str, generation: int | None, now: datetime) -> None:
    """Ready=False ``AwaitingApproval``: not Reconciling (nothing runs) and not Stalled (no error)."""
    conditions = remove_condition(
        remove_condition(list(status.get("conditions") or []), CONDITION_RECONCILING), CONDITION_STALLED
    )
    status["conditions"] = set_condition(
        conditions, CONDITION_READY, "False", AWAITING_APPROVAL, message, generation, now
    )
