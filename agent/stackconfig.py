"""Turn SetAllConfig items into one ``pulumi config set-all`` call.

Two shapes, chosen like the Go agent does:

* all values are strings: ``set-all --path`` with a ConfigMap. Keys not meant as paths are escaped
  as ``["name"]`` so path parsing keeps them verbatim (a key like ``a.b`` stays one key);
* any structured value (a literal object/list/number/bool, or ``valueFrom`` with ``json``): one
  ``set-all --json`` document ``{"proj:key": {"value": str, "objectValue": any, "secret": bool}}``
  (needs Pulumi CLI >= 3.202.0). ``path`` cannot be combined with a structured value.

Keys without a namespace are put in the project's namespace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from pulumi.automation import ConfigValue

MIN_JSON_CONFIG_VERSION = (3, 202, 0)


class ConfigError(ValueError):
    """A config item cannot be applied; the message is safe to return to the caller."""


@dataclass(frozen=True)
class PathConfig:
    values: dict[str, ConfigValue]


@dataclass(frozen=True)
class JsonConfig:
    document: str  # never logged: may hold secrets


def _namespaced(project: str, key: str) -> str:
    if not key:
        raise ConfigError("invalid config key: empty")
    return key if ":" in key else f"{project}:{key}"


def _is_structured(item: pb.ConfigItem) -> bool:
    if item.value is not None:
        literal = _literal(item.value)
        return literal is not None and not isinstance(literal, str)
    if item.value_from is not None:
        return bool(item.value_from.json)
    return False


def _literal(value: Value) -> Any:
    """The plain Python value of a google.protobuf.Value (None for null); integral numbers are ints
    again (Value carries every number as a double: the Stack's ``count: 3`` must not become ``3.0``)."""
    try:
        return _ints(value.to_dict())
    except ValueError:  # a Value with none of its kinds set
        raise ConfigError("invalid config value") from None


def _ints(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 2**53:
        return int(obj)
    if isinstance(obj, dict):
        return {k: _ints(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_ints(v) for v in obj]
    return obj


def _read_from(vf: pb.ConfigValueFrom, env: Callable[[str], str | None]) -> str:
    if vf.env is not None:
        data = env(vf.env)
        if data is None:
            raise ConfigError(f"missing value for environment variable: {vf.env}")
        return data
    if vf.path is not None:
        try:
            return Path(vf.path).read_text()
        except (OSError, UnicodeDecodeError):
            raise ConfigError(f"unreadable path: {vf.path}") from None
    raise ConfigError("invalid config value")


def _string_value(item: pb.ConfigItem, env: Callable[[str], str | None]) -> str:
    if item.value is not None:
        v = _literal(item.value)
        return "" if v is None else str(v)
    if item.value_from is not None:
        return _read_from(item.value_from, env)
    raise ConfigError("invalid config value")


def plan(
    project: str, items: list[pb.ConfigItem], env: Callable[[str], str | None]
) -> PathConfig | JsonConfig:
    """Decide how to apply ``items``; raises ConfigError for an item that cannot be applied."""
    if any(_is_structured(i) for i in items):
        return JsonConfig(json.dumps(_json_document(project, items, env), sort_keys=True))
    values: dict[str, ConfigValue] = {}
    for item in items:
        key = _namespaced(project, item.key)
        namespace, _, name = key.partition(":")
        if not item.path and not (name.startswith('["') and name.endswith('"]')):
            name = "[" + json.dumps(name) + "]"
        values[f"{namespace}:{name}"] = ConfigValue(value=_string_value(item, env), secret=bool(item.secret))
    return PathConfig(values)


def _json_document(
    project: str, items: list[pb.ConfigItem], env: Callable[[str], str | None]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        structured = _is_structured(item)
        if item.path and structured:
            raise ConfigError(f"config item {item.key!r}: path=true is incompatible with JSON values")
        entry: dict[str, Any] = {"secret": bool(item.secret)}
        if item.value is not None and structured:
            obj = _literal(item.value)
            entry["value"] = json.dumps(obj, separators=(",", ":"), sort_keys=True)
            entry["objectValue"] = obj
        elif item.value_from is not None and structured:
            raw = _read_from(item.value_from, env)
            try:
                entry["objectValue"] = json.loads(raw)
            except json.JSONDecodeError:
                raise ConfigError(f"config item {item.key!r}: value is not valid JSON") from None
            entry["value"] = raw
        else:
            entry["value"] = _string_value(item, env)
        out[_namespaced(project, item.key)] = entry
    return out
