"""Taking over a Stack's status from the field managers that wrote it before pko (pure, no I/O).

The Go operator writes a Stack's status with plain updates, so the apiserver files every field it
changed under its own manager (``manager``, from its User-Agent). pko applies the status (server-side
apply, forced), which makes pko an owner of what it writes but leaves the rest to the old owner:
what pko's status no longer says (a ``Reconciling`` condition once Ready, ``currentUpdate`` once
recorded) is not removed, because pko never owned it, and an entry owned in parts is left half
removed (the apiserver then refuses the status: a condition without its ``message``).

So when a write leaves the status other than pko wrote it, the other managers' claims on
``/status`` are handed to pko's own apply entry (what client-go's ``csaupgrade`` does for kubectl):
the fields they own become pko's, and the next apply removes what pko does not say.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pko.machinery.conditions import format_time
from pko.machinery.resource import Obj

__all__ = ["merge_fields", "take_over_status"]


def merge_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The union of two ``fieldsV1`` sets (nested maps of ``f:``/``k:``/``v:``/``i:`` keys)."""
    out: dict[str, Any] = copy.deepcopy(dict(a))
    for key, value in b.items():
        mine = out.get(key)
        if isinstance(mine, Mapping) and isinstance(value, Mapping):
            out[key] = merge_fields(mine, value)
        elif key not in out:
            out[key] = copy.deepcopy(value)
    return out


def take_over_status(managed: list[Obj], manager: str, api_version: str, now: datetime) -> list[Obj] | None:
    """``metadata.managedFields`` with every other manager's claim on ``/status`` moved into
    ``manager``'s apply entry (made if missing); None when no other manager claims ``/status``."""

    def ours(entry: Obj) -> bool:
        return entry.get("manager") == manager and entry.get("operation") == "Apply"

    on_status = [e for e in managed if e.get("subresource") == "status"]
    others = [e for e in on_status if not ours(e)]
    if not others:
        return None
    mine = next((e for e in on_status if ours(e)), None)
    fields: dict[str, Any] = dict((mine or {}).get("fieldsV1") or {})
    for entry in others:
        fields = merge_fields(fields, entry.get("fieldsV1") or {})
    entry = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": (mine or {}).get("apiVersion") or api_version,
        "time": format_time(now),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
        "subresource": "status",
    }
    return [*(e for e in managed if e.get("subresource") != "status"), entry]
