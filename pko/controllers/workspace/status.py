"""The Workspace status this controller owns, and when a new one is written (pure): the finding a
reconcile concluded as ``Ready`` (and ``Stalled``), the hold that coalesces a starting pod's
progress messages, and the JSON-config version check an agent's CLI must pass."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from pko.api.workspace import WorkspaceSpec
from pko.machinery.conditions import ConditionStatus, get_condition, remove_condition, set_condition
from pko.machinery.resource import Obj

__all__ = [
    "JSON_CONFIG_MIN_VERSION",
    "PROGRESS_REASONS",
    "READY",
    "STALLED",
    "STATUS_FIELDS",
    "STATUS_HOLD",
    "Finding",
    "desired_status",
    "has_json_config",
    "held_for",
    "incompatible",
]

READY: Final = "Ready"
STALLED: Final = "Stalled"
# The status fields this controller owns.
STATUS_FIELDS: Final = ("observedGeneration", "conditions", "address", "pulumiVersion")
# The reasons that only follow a starting (or replaced) pod, set by the StatefulSet controller and
# the kubelet: their messages change several times in a few seconds, with nothing to do for anyone.
PROGRESS_REASONS: Final = frozenset({"RollingUpdate", "WaitingForReplicas"})
# How long one progress status stands before another progress status replaces it (held_for).
STATUS_HOLD: Final = 5.0
JSON_CONFIG_MIN_VERSION: Final = (3, 202, 0)


@dataclass(frozen=True, slots=True)
class Finding:
    """What one reconcile concluded: the Ready condition, and Stalled when only the user can help."""

    reason: str
    message: str
    ready: bool = False
    stalled: bool = False


def desired_status(
    ws: Obj,
    finding: Finding,
    *,
    address: str | None = None,
    version: str | None = None,
    keep_stalled: bool = False,
) -> Obj:
    """The status this controller owns: ``Ready`` from the finding, ``Stalled`` when only the user
    can help (kept as it is while deleting), the agent's address once Ready, the CLI version."""
    current: Obj = ws.get("status") or {}
    generation = int(ws["metadata"].get("generation") or 0)
    conditions: list[Obj] | None = current.get("conditions")
    ready: ConditionStatus = "True" if finding.ready else "False"
    conditions = set_condition(conditions, READY, ready, finding.reason, finding.message, generation)
    if finding.stalled:
        conditions = set_condition(conditions, STALLED, "True", finding.reason, finding.message, generation)
    elif not keep_stalled:
        conditions = remove_condition(conditions, STALLED)
    status: Obj = {"observedGeneration": generation, "conditions": conditions}
    if address:
        status["address"] = address
    version = version or current.get("pulumiVersion")
    if version:
        status["pulumiVersion"] = version
    return status


def held_for(current: Obj, status: Obj, since_write: float | None) -> float:
    """How long ``status`` waits before it replaces ``current`` (0.0: write it now); the reconcile
    then looks again when the hold ends, and writes what it finds then.

    Why: a new Workspace's pod goes through a handful of states in its first seconds (the StatefulSet
    seen, the pod created, its init container running, its server starting, its IP given), and each
    was a status write with nothing for anyone to do (the 20-Stack deploy benchmark: 8.3 status writes
    per Workspace, 4 of them ``WaitingForReplicas`` messages 0.2 to 3 s apart). So one progress status
    (:data:`PROGRESS_REASONS`) replaces another only once the one written stands
    :data:`STATUS_HOLD` seconds; the last word is written when the hold ends, so a pod that keeps
    waiting on something (a long init container) says so at most that much later. Everything else is
    written at once: any other reason (``Installing``, ``Initializing``, each failure reason, ``Ready``),
    ``Stalled`` coming or going, a new generation observed, another address or CLI version; and the
    first status after a restart of the operator (``since_write`` None: this process wrote none yet).
    """
    if since_write is None or since_write >= STATUS_HOLD:
        return 0.0
    if not (_progress(current) and _progress(status)):
        return 0.0
    if _without_ready_words(current) != _without_ready_words(status):
        return 0.0
    return STATUS_HOLD - since_write


def _progress(status: Obj) -> bool:
    """Not Ready for one of the :data:`PROGRESS_REASONS`, and not Stalled."""
    conditions = status.get("conditions")
    ready = get_condition(conditions, READY) or {}
    return (
        ready.get("status") == "False"
        and ready.get("reason") in PROGRESS_REASONS
        and get_condition(conditions, STALLED) is None
    )


def _without_ready_words(status: Obj) -> dict[str, Any]:
    """The owned fields with the Ready condition's reason and message left out."""
    owned = {f: status.get(f) for f in STATUS_FIELDS if f != "conditions"}
    owned["conditions"] = [
        {k: v for k, v in c.items() if k not in ("reason", "message")} if c.get("type") == READY else c
        for c in status.get("conditions") or []
    ]
    return owned


# --- the JSON-config version check ------------------------------------------------------------


def has_json_config(spec: WorkspaceSpec) -> bool:
    """Whether a stack uses structured config (needs Pulumi CLI >= 3.202.0), as the Go operator checks."""
    for stack in spec.stacks or []:
        for item in stack.config or []:
            if item.value is not None and not isinstance(item.value, str):
                return True
            if item.value_from is not None and item.value_from.json_:
                return True
    return False


def _version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", version.strip())
    return tuple(int(p) for p in match.groups()) if match else None


def incompatible(spec: WorkspaceSpec, version: str) -> Finding | None:
    """``IncompatibleConfiguration`` (Stalled) when ``spec`` needs JSON config the agent's CLI
    ``version`` lacks; None when it is fine."""
    if not has_json_config(spec):
        return None
    parsed = _version_tuple(version)
    if parsed is None:
        return Finding(
            "IncompatibleConfiguration", f"Failed to parse Pulumi version {version!r}", stalled=True
        )
    if parsed < JSON_CONFIG_MIN_VERSION:
        minimum = ".".join(str(p) for p in JSON_CONFIG_MIN_VERSION)
        message = f"Pulumi CLI version {version} does not support JSON configuration, require >= v{minimum}"
        return Finding("IncompatibleConfiguration", message, stalled=True)
    return None
