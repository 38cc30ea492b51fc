"""``kubectl pko logs`` (pure): which Update, where its engine output is, and picking it out.

The engine output is not stored in any object: the workspace agent logs each line Pulumi prints
as a JSON log line of its container (``pulumi``, in pod ``<workspace>-workspace-0``):
``{"msg": "pulumi", "operation": <the Update's uid>, "line": ...}`` (``pko/agent/runneroperations.py``,
``on_output``/``on_error``). So the output of an Update lasts as long as that container's log
(the pod replaced, it is gone); the Update's ``status.message`` keeps the last lines of an error
for good, and is what the command falls back to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from pko.kubectl.stackview import status_of

__all__ = ["PULUMI_CONTAINER", "chosen_update", "engine_lines", "workspace_pod"]

PULUMI_CONTAINER: Final = "pulumi"
"""The workspace pod's container running the agent (pko.controllers.workspace.workloads)."""
_ENGINE_EVENT: Final = "pulumi"
"""The agent's log message for one line of engine output."""


def chosen_update(stack: Mapping[str, Any], requested: str | None) -> str | None:
    """The Update to show: ``requested``, else the running one, else the last one."""
    if requested:
        return requested
    status = status_of(stack)
    for field in ("currentUpdate", "lastUpdate"):
        name = (status.get(field) or {}).get("name")
        if name:
            return str(name)
    return None


def workspace_pod(update: Mapping[str, Any], stack_name: str) -> tuple[str, str]:
    """(the Workspace, its pod) that ran ``update``: the StatefulSet ``<ws>-workspace``'s one pod."""
    workspace = str((update.get("spec") or {}).get("workspaceName") or stack_name)
    return workspace, f"{workspace}-workspace-0"


def engine_lines(log: str, operation: str) -> list[str]:
    """The engine output of ``operation`` (an Update's uid) in an agent's log, in order; other
    lines (the agent's own, other operations', a console-format log) are left out."""
    lines: list[str] = []
    for raw in log.splitlines():
        if not raw.startswith("{"):
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(entry, dict)
            and entry.get("msg", entry.get("event")) == _ENGINE_EVENT
            and entry.get("operation") == operation
            and isinstance(entry.get("line"), str)
        ):
            lines.append(entry["line"])
    return lines
