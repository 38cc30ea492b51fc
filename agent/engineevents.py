"""Turn the Automation API's engine-event objects back into the CLI's event-log JSON shape.

The Automation API hands ``on_event`` parsed objects (``pulumi.automation.events``); the operator
wants the wire shape the CLI writes (``{"sequence": 3, "resourcePreEvent": {"metadata": ...}}``), as
the Go agent sends it. Attribute names are snake_case versions of the JSON keys, with one exception
(``policy_packs`` is ``PolicyPacks``). Dictionary keys (resource inputs and outputs) are user data
and are kept verbatim; ``None`` attributes are omitted, as the CLI omits empty fields.

It also reads the events' per-resource steps into the operation's change set (``ChangeSet``): the
resources a preview would change, an up changed, a refresh found drifted.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pko.api.generated.pko.agent import v1 as pb
from pulumi.automation import events

_KEY_OVERRIDES = {"policy_packs": "PolicyPacks"}


def _json_key(attr: str) -> str:
    override = _KEY_OVERRIDES.get(attr)
    if override is not None:
        return override
    head, *rest = attr.split("_")
    return head + "".join(part.title() for part in rest)


def to_json_value(value: Any) -> Any:
    """Convert an engine-event object (or a value inside one) to plain JSON data."""
    if isinstance(value, events.BaseEvent):
        return {_json_key(k): to_json_value(v) for k, v in vars(value).items() if v is not None}
    if isinstance(value, enum.Enum):
        return to_json_value(value.value)
    if isinstance(value, Mapping):
        return {str(k.value if isinstance(k, enum.Enum) else k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def engine_event_to_json(event: events.EngineEvent) -> dict[str, Any]:
    """The event as the CLI's ``--event-log`` line for it would read."""
    data = to_json_value(event)
    assert isinstance(data, dict)
    if event.cancel_event is not None:
        data["cancelEvent"] = {}
    return data


# -- per-resource change sets ---------------------------------------------------------------------
# Step events: what the engine is about to do (pre) and what it did or, in a preview, would do
# (outputs). A refresh reports every resource `refresh` before reading it (old and new the same) and
# its drift after: `update` (the provider read other values) or `delete` (the resource is gone).
_STEP_EVENTS = ("resourcePreEvent", "resOutputsEvent")
_UNCHANGED_OPS = frozenset({"same"})
_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")


def _join(prefix: str, key: str) -> str:
    """A property path as the engine spells one: ``a.b``, or ``a["b.c"]`` for a key that is no name."""
    if _IDENTIFIER.match(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key)}]"


def differing_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The property paths (through objects; a list or a scalar is one value) whose values differ."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return [] if old == new else [prefix]
    paths: list[str] = []
    for key in sorted({*old, *new}, key=str):
        path = _join(prefix, str(key))
        if key not in old or key not in new:
            paths.append(path)
        else:
            paths += differing_paths(old[key], new[key], path)
    return paths


def _state(metadata: Mapping[str, Any], side: str, part: str) -> Mapping[str, Any]:
    state = metadata.get(side)
    value = state.get(part) if isinstance(state, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def step_paths(metadata: Mapping[str, Any]) -> list[str]:
    """The changed property paths of one step: the engine's ``detailedDiff`` keys, else its ``diffs``;
    a provider that reports neither (a dynamic provider) gets what ``pulumi preview --diff`` shows:
    the inputs that differ between the old and new state, or the outputs where the inputs agree and
    both sides have outputs (a refresh read them back; a preview's new outputs are not known)."""
    detailed = metadata.get("detailedDiff")
    if isinstance(detailed, Mapping) and detailed:
        return sorted(str(k) for k in detailed)
    diffs = metadata.get("diffs")
    if isinstance(diffs, list) and diffs:
        return sorted({str(d) for d in diffs})
    if not (isinstance(metadata.get("old"), Mapping) and isinstance(metadata.get("new"), Mapping)):
        return []
    paths = differing_paths(_state(metadata, "old", "inputs"), _state(metadata, "new", "inputs"))
    if paths:
        return paths
    old_out, new_out = _state(metadata, "old", "outputs"), _state(metadata, "new", "outputs")
    return differing_paths(old_out, new_out) if old_out and new_out else []


class ChangeSet:
    """The resources an operation changes, gathered from its engine events (``observe``): one entry
    per (urn, op), `same` steps and refresh steps that found nothing left out, paths merged."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, str], tuple[str, set[str]]] = {}

    def observe(self, event: Mapping[str, Any]) -> None:
        for kind in _STEP_EVENTS:
            body = event.get(kind)
            metadata = body.get("metadata") if isinstance(body, Mapping) else None
            if isinstance(metadata, Mapping):
                self._observe_step(metadata)

    def _observe_step(self, metadata: Mapping[str, Any]) -> None:
        op, urn = str(metadata.get("op") or ""), str(metadata.get("urn") or "")
        if not op or not urn or op in _UNCHANGED_OPS:
            return
        paths = step_paths(metadata)
        if op == "refresh" and not paths:
            return
        type_, known = self._steps.get((urn, op), (str(metadata.get("type") or ""), set()))
        self._steps[(urn, op)] = (type_, known | set(paths))

    def changes(self) -> list[pb.ResourceChange]:
        """Sorted by urn, then op (deterministic: a digest over them is stable)."""
        return [
            pb.ResourceChange(urn=urn, type=type_, op=op, paths=sorted(paths))
            for (urn, op), (type_, paths) in sorted(self._steps.items())
        ]


def resource_changes(events: Iterable[Mapping[str, Any]]) -> list[pb.ResourceChange]:
    """The change set of a whole event stream (e.g. a journaled operation's)."""
    changes = ChangeSet()
    for event in events:
        changes.observe(event)
    return changes.changes()
