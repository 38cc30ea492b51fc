"""Argo CD's Lua environment for resource customizations, emulated with lupa, to run config/argocd's
scripts as Argo CD runs them (argo-cd ``util/lua/lua.go`` and ``oslib_safe.go``).

What Argo CD does, and what this module does in its place:

* gopher-lua, a Lua 5.1: here lupa's ``lua51`` runtime (the C Lua 5.1), the same language; not
  lupa's default runtime (Lua 5.5 in lupa 2.8) nor 5.3/5.4, whose integer subtype prints ``3.0``
  for a float and whose ``//``, ``goto`` and ``&`` gopher-lua would refuse, nor LuaJIT (``goto``).
* a script from ``argocd-cm`` (``useOpenLibs`` unset) gets only the base, table and package
  libraries and a "safe" ``os`` with ``time`` and ``date``: here every other library is removed,
  with the string metatable's ``__index`` (gopher-lua sets string methods up only with its
  string library), so a script that calls ``string.format`` or ``s:sub`` fails here as there.
  ``os.date`` here is C's; Argo's reimplements the common ``%`` flags (``%Y %m %d %X %H %M %S``
  ...) the same way, but not every one (``%c`` differs, ``%j`` is not supported).
* ``obj`` is the object decoded from JSON (argo-cd's ``decodeValue``): maps are tables, lists are
  sequences, numbers are Lua numbers, ``null`` is nil (a list drops it, as ``LTable.Append`` does).
* the result is encoded as JSON as ``layeh.com/gopher-json`` does: a table with a sequence part is
  an array, any other non-empty table an object (its keys must be strings), an empty one ``[]``.
  A health result is then a ``{status, message}`` (a status outside Argo's set is ``Unknown``); a
  discovery result maps action names to ``{disabled, iconClass, displayName}`` (an empty table:
  enabled); an action's result is the new object, with ``cleanReturnedObj``'s repair of empty
  maps turned into ``[]``, and Argo CD patches the live object with the JSON merge patch from it.

Not emulated: the one-second timeout Argo CD gives a script.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from lupa import lua51  # type: ignore[import-untyped]

REPO: Final = Path(__file__).resolve().parents[2]
CONFIGMAP: Final = REPO / "config" / "argocd" / "argocd-cm.yaml"
HEALTH_KEY: Final = "resource.customizations.health.pulumi.com_Stack"
ACTIONS_KEY: Final = "resource.customizations.actions.pulumi.com_Stack"
HEALTH_STATUSES: Final = frozenset({"Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing"})

Obj = dict[str, Any]

# Run first in every fresh state: leave what argo-cd's runLua opens (base, package, table, safe os).
_SANDBOX: Final = """
local time, date = os.time, os.date
getmetatable("").__index = nil
string, math, io, debug, coroutine = nil, nil, nil, nil, nil
os = {time = time, date = date}
for name in pairs(package.loaded) do
  if name ~= "_G" and name ~= "package" and name ~= "table" then
    package.loaded[name] = nil
  end
end
package.loaded.os = os
package.path, package.cpath = "", ""
"""


class LuaScriptError(Exception):
    """The script raised an error, or returned what Argo CD refuses (Argo shows the error)."""


@dataclass(frozen=True, slots=True)
class Health:
    status: str
    message: str


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    disabled: bool
    icon_class: str | None = None
    display_name: str | None = None


@dataclass(frozen=True, slots=True)
class Scripts:
    """The Stack's health script, action discovery script and action scripts by name."""

    health: str
    discovery: str
    actions: Mapping[str, str]

    @classmethod
    def from_configmap(cls, path: Path = CONFIGMAP) -> Scripts:
        """The scripts as users paste them: parsed out of the ConfigMap patch, as Argo CD reads it."""
        data = yaml.safe_load(path.read_text())["data"]
        actions = yaml.safe_load(data[ACTIONS_KEY])
        return cls(
            health=data[HEALTH_KEY],
            discovery=actions["discovery.lua"],
            actions={d["name"]: d["action.lua"] for d in actions["definitions"]},
        )


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, Mapping):
        table = runtime.table()
        for key, item in value.items():
            if item is not None:
                table[str(key)] = _to_lua(runtime, item)
        return table
    if isinstance(value, list):
        table = runtime.table()
        for item in value:
            if item is not None:
                table[len(table) + 1] = _to_lua(runtime, item)
        return table
    if isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"not a JSON value: {value!r}")


def _to_json(value: Any) -> Any:
    if lua51.lua_type(value) == "table":
        length = len(value)
        if length > 0:
            return [_to_json(value[i]) for i in range(1, length + 1)]
        items = list(value.items())
        if any(not isinstance(k, str) for k, _ in items):
            raise LuaScriptError("cannot encode mixed or invalid key types")
        return {k: _to_json(v) for k, v in items} if items else []
    if lua51.lua_type(value) is not None:
        raise LuaScriptError(f"cannot encode a Lua {lua51.lua_type(value)} as JSON")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def run(script: str, obj: Mapping[str, Any]) -> Any:
    """Run ``script`` in a fresh sandboxed state with the global ``obj``; its result as JSON
    (Python values)."""
    runtime = lua51.LuaRuntime(register_eval=False, register_builtins=False, unpack_returned_tuples=False)
    runtime.execute(_SANDBOX)
    # A JSON round trip first: what Argo decodes is the object's JSON, never Python objects.
    runtime.globals()["obj"] = _to_lua(runtime, json.loads(json.dumps(obj)))
    try:
        result = runtime.execute(script)
    except lua51.LuaError as exc:
        raise LuaScriptError(str(exc)) from exc
    if lua51.lua_type(result) != "table":
        raise LuaScriptError(f"expect table output from Lua script, not {lua51.lua_type(result) or result!r}")
    return _to_json(result)


def health(obj: Mapping[str, Any], scripts: Scripts | None = None) -> Health:
    """What Argo CD shows as the Stack's health."""
    result = run((scripts or Scripts.from_configmap()).health, obj)
    if not isinstance(result, dict):
        raise LuaScriptError(f"a health status must be an object, not {result!r}")
    status = str(result.get("status") or "")
    if status not in HEALTH_STATUSES:
        return Health("Unknown", "Lua returned an invalid health status")
    return Health(status, str(result.get("message") or ""))


def discover(obj: Mapping[str, Any], scripts: Scripts | None = None) -> dict[str, Action]:
    """The actions Argo CD offers on the Stack, by name."""
    result = run((scripts or Scripts.from_configmap()).discovery, obj)
    if result == []:
        return {}
    actions: dict[str, Action] = {}
    for name, spec in result.items():
        if not isinstance(spec, dict):  # an empty table: an enabled action with no details
            actions[name] = Action(name, False)
            continue
        disabled = spec.get("disabled")
        actions[name] = Action(
            name,
            disabled if isinstance(disabled, bool) else False,
            spec.get("iconClass"),
            spec.get("displayName"),
        )
    return actions


def run_action(name: str, obj: Mapping[str, Any], scripts: Scripts | None = None) -> Obj:
    """The object the action ``name`` returns, repaired as Argo CD repairs it before patching."""
    script = (scripts or Scripts.from_configmap()).actions[name]
    result = run(script, obj)
    if not isinstance(result, dict):
        raise LuaScriptError(f"action {name} must return the object (old-style output), not {result!r}")
    return _clean(result, json.loads(json.dumps(obj)))


def _clean(new: Obj, old: Mapping[str, Any]) -> Obj:
    """argo-cd's cleanReturnedObj: an empty map the script left alone came back as ``[]``."""
    for key, old_value in old.items():
        if key not in new:
            continue
        new_value = new[key]
        if isinstance(new_value, dict) and isinstance(old_value, dict):
            new[key] = _clean(new_value, old_value)
        elif isinstance(new_value, list) and isinstance(old_value, dict) and not new_value:
            new[key] = old_value
        elif isinstance(new_value, list) and isinstance(old_value, list):
            new[key] = _clean_list(new_value, old_value)
    return new


def _clean_list(new: list[Any], old: list[Any]) -> list[Any]:
    for i, new_value in enumerate(new):
        old_value = old[i] if i < len(old) else None
        if isinstance(new_value, dict) and isinstance(old_value, dict):
            new[i] = _clean(new_value, old_value)
        elif isinstance(new_value, list) and isinstance(old_value, list):
            new[i] = _clean_list(new_value, old_value)
    return new


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """The RFC 7386 merge patch from ``old`` to ``new`` (what Argo CD sends for an action's result)."""
    patch: Obj = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if key in old and before == value:
            continue
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    return patch


__all__ = [
    "ACTIONS_KEY",
    "CONFIGMAP",
    "HEALTH_KEY",
    "Action",
    "Health",
    "LuaScriptError",
    "Scripts",
    "discover",
    "health",
    "merge_patch",
    "run",
    "run_action",
]
