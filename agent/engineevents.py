"""Turn the Automation API's engine-event objects back into the CLI's event-log JSON shape.

The Automation API hands ``on_event`` parsed objects (``pulumi.automation.events``); the operator
wants the wire shape the CLI writes (``{"sequence": 3, "resourcePreEvent": {"metadata": ...}}``), as
the Go agent sends it. Attribute names are snake_case versions of the JSON keys, with one exception
(``policy_packs`` is ``PolicyPacks``). Dictionary keys (resource inputs and outputs) are user data
and are kept verbatim; ``None`` attributes are omitted, as the CLI omits empty fields.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

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
