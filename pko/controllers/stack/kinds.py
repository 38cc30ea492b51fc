"""The kinds of Update a Stack runs, as one table: what each needs and what it records (pure data).

A Stack runs the operation its spec calls for (an up, a preview-only Stack's preview, a destroy
when it is deleted) and pko's additions (issue 29): a refresh on request, a drift check (a
read-only refresh), and through the approval gate a preview that saves a plan and the up that
applies it once approved. Every decision that differs by kind reads a row here (never the kind's
name): what the Update's spec carries, whether the approval gate, prerequisites and the conditions
take part, and how its result is recorded (:mod:`pko.controllers.stack.results` by ``records``).
``status.currentUpdate.kind`` names a row (``recorded_as``; the operation the spec calls for is
not named, as before the kinds arrived and as the Go operator wrote it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pko.api.update import UpdateType

__all__ = [
    "APPLY",
    "DESTROY",
    "DRIFT",
    "KINDS",
    "PLAN",
    "PREVIEW",
    "REFRESH",
    "UP",
    "Records",
    "UpdateKind",
    "kind_of",
    "recorded_kind",
    "spec_kind",
]

Records = Literal["result", "plan", "applied", "refresh", "drift"]
"""How an ended Update's result is recorded: ``result`` the Stack's last update (outputs,
conditions, retries), ``plan`` a plan to approve, ``applied`` an approved up (previewed again when
its plan no longer applies), ``refresh`` ``status.lastRefresh``, ``drift`` ``status.drift``."""


@dataclass(frozen=True, slots=True)
class UpdateKind:
    """One kind of Update: its ``type`` (the Update's ``spec.type``), the name ``status.currentUpdate``
    records it by (None: the operation the spec calls for), and what it needs and records."""

    name: str
    type: UpdateType
    recorded_as: str | None = None
    spec_flag: str | None = None
    """A spec field set true on the Update: what tells this kind from its type's plain one."""
    applies_plan: bool = False
    """``spec.plan`` carries the approved plan."""
    up_options: bool = True
    """The Update takes an up's options (``refresh``: run with a refresh first)."""
    drops_up_options: bool = False
    """An up's options (``refresh``, ``targetDependents``, from the Stack's update template) are
    removed: a refresh takes none."""
    gated: bool = False
    """Runs through the approval gate (which may run a plan preview, or an approved up, instead)."""
    prerequisites: bool = True
    """Waits for the Stack's prerequisites (a refresh, a drift check or a destroy does not)."""
    quiet: bool = False
    """Leaves the conditions alone and is announced by a log line (a periodic read must not flap
    Ready), not the Event and ``Reconciling`` of an operation."""
    holds_plan: bool = False
    """Uses ``status.plan``: once it ends (completed, cancelled or lost) the plan is spent."""
    lost_fails: bool = True
    """An Update of this kind that is gone counts as a failed update (a retry follows)."""
    publishes_outputs: bool = False
    """Once it succeeded, its outputs go into the object ``spec.outputs`` names (an up's: a preview
    or a refresh changes no output apps read, a destroy's object goes with the Stack)."""
    records: Records = "result"
    records_cancelled: bool = False
    """Its result is recorded also when it was cancelled (the cancellation says the rest)."""


UP: Final = UpdateKind("up", "up", gated=True, publishes_outputs=True)
PREVIEW: Final = UpdateKind("preview", "preview")
DESTROY: Final = UpdateKind("destroy", "destroy", up_options=False, prerequisites=False)
REFRESH: Final = UpdateKind(
    "refresh",
    "refresh",
    "refresh",
    up_options=False,
    drops_up_options=True,
    prerequisites=False,
    lost_fails=False,
    records="refresh",
    records_cancelled=True,
)
DRIFT: Final = UpdateKind(
    "drift check",
    "refresh",
    "drift",
    spec_flag="previewOnly",
    up_options=False,
    drops_up_options=True,
    prerequisites=False,
    quiet=True,
    lost_fails=False,
    records="drift",
)
PLAN: Final = UpdateKind(
    "approval preview",
    "preview",
    "plan",
    spec_flag="savePlan",
    holds_plan=True,
    lost_fails=False,
    records="plan",
)
APPLY: Final = UpdateKind(
    "approved up",
    "up",
    "apply",
    applies_plan=True,
    holds_plan=True,
    publishes_outputs=True,
    records="applied",
)

KINDS: Final = (UP, PREVIEW, DESTROY, REFRESH, DRIFT, PLAN, APPLY)
"""The table; a marked kind (``spec_flag``, ``applies_plan``) before its type's plain one."""

_BY_RECORDED: Final = {k.recorded_as: k for k in KINDS if k.recorded_as}
_MARKED_FIRST: Final = sorted(KINDS, key=lambda k: not (k.spec_flag or k.applies_plan))


def spec_kind(*, preview: bool, deleting: bool) -> UpdateKind:
    """The operation the spec calls for: a destroy when finalizing, a preview for a preview-only
    Stack, else an up."""
    if deleting:
        return DESTROY
    return PREVIEW if preview else UP


def kind_of(update: Mapping[str, Any]) -> UpdateKind:
    """What ``update`` (one this Stack created) is for, read from its spec."""
    spec = update.get("spec") or {}
    for kind in _MARKED_FIRST:
        if kind.type != spec.get("type"):
            continue
        if (kind.spec_flag and not spec.get(kind.spec_flag)) or (kind.applies_plan and not spec.get("plan")):
            continue
        return kind
    return UP


def recorded_kind(current: Mapping[str, Any], update: Mapping[str, Any] | None) -> UpdateKind:
    """What the Update ``status.currentUpdate`` names is for: the kind it records, else read from the
    Update (one created before kinds were recorded); an up's when neither says (all of the spec's
    own operations are recorded alike)."""
    named = _BY_RECORDED.get(str(current.get("kind") or ""))
    if named is not None:
        return named
    return kind_of(update) if update is not None else UP
