"""A small Pulumi YAML evaluator: config, variables, resources, outputs and ``${...}`` references.

Supported: ``config:`` / ``configuration:`` declarations (type, default, secret), ``variables:``,
``resources:`` (``type``, ``properties``, ``options`` ``dependsOn``/``parent``/``deletedWith``/``provider``/
``providers``/``protect``), ``outputs:``;
interpolation ``${name}``, ``${res.prop.sub[0]["k"]}``, ``${res.id}``, ``${res.urn}``, ``$${`` escapes;
``fn::secret``, ``fn::join``, ``fn::split``, ``fn::select``, ``fn::toJSON``, ``fn::toBase64``.
A whole-string ``${x}`` keeps its type; anything else is a string. A bare resource reference ``${res}``
is a resource, as in pulumi-yaml: resource-valued options take it (and only it); the fake refuses it as a
property or output value, where the real CLI would pass a resource reference. Secrets propagate; during
preview unknown outputs propagate as :data:`UNKNOWN`. Resources are registered in dependency order (ties
keep file order), as pulumi-yaml does.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .config import PathSegment, parse_property_path
from .errors import CliError
from .values import UNKNOWN, Secret, has_unknown, is_secret_value, plain
from .workspace import Project

_INTERP = re.compile(r"\$\$\{|\$\{([^}]*)\}")


class ProgramError(Exception):
    """An error in the user's program, reported as a diagnostic on the stack resource."""


@dataclass
class ResourceDecl:
    name: str
    type: str
    properties: dict[str, Any]
    options: dict[str, Any]
    deps: list[str] = field(default_factory=list)
    """Resources that must be registered first: everything referenced by properties and options."""
    property_deps: list[str] = field(default_factory=list)
    """Resources referenced by the properties (through variables too): the state's implicit dependencies."""


@dataclass
class ProgramSpec:
    config_decls: dict[str, dict[str, Any]]
    variables: dict[str, Any]
    resources: dict[str, ResourceDecl]
    outputs: dict[str, Any]


@dataclass
class ResourceView:
    """What a program can see of a registered resource."""

    urn: str
    id: Any
    outputs: dict[str, Any]

    @property
    def qualified_type(self) -> str:
        """The URN's type part (``Parent$Child`` chain), which a child's URN extends."""
        return self.urn.split("::")[2]


RESOURCE_OPTIONS = ("parent", "deletedWith", "provider")
"""Options whose value is one resource (``${res}``)."""
RESOURCE_LIST_OPTIONS = ("dependsOn", "providers")
"""Options whose value is a list of resources."""


def _refs_in(raw: Any, out: set[str]) -> None:
    if isinstance(raw, str):
        for match in _INTERP.finditer(raw):
            expr = match.group(1)
            if expr is not None:
                out.add(_root_name(expr.strip()))
    elif isinstance(raw, dict):
        for v in raw.values():
            _refs_in(v, out)
    elif isinstance(raw, list):
        for v in raw:
            _refs_in(v, out)


def _root_name(expr: str) -> str:
    cut = len(expr)
    for ch in ".[":
        idx = expr.find(ch)
        if idx >= 0:
            cut = min(cut, idx)
    return expr[:cut]


def load_program(project: Project) -> ProgramSpec:
    body = dict(project.body)
    main = project.root / "Main.yaml"
    if "resources" not in body and "outputs" not in body and main.is_file():
        import yaml

        extra = yaml.safe_load(main.read_text(encoding="utf-8")) or {}
        body.update(extra)
    decls: dict[str, dict[str, Any]] = {}
    for section in ("configuration", "config"):
        for key, decl in (body.get(section) or {}).items():
            decls[str(key)] = decl if isinstance(decl, dict) else {"default": decl}
    resources: dict[str, ResourceDecl] = {}
    for name, spec in (body.get("resources") or {}).items():
        if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
            raise ProgramError(f"resource {name!r} must have a string 'type'")
        if "get" in spec:
            raise ProgramError(f"resource {name!r}: 'get' is not supported by the fake pulumi CLI")
        resources[str(name)] = ResourceDecl(
            name=str(name),
            type=spec["type"],
            properties=dict(spec.get("properties") or {}),
            options=dict(spec.get("options") or {}),
        )
    return ProgramSpec(
        config_decls=decls,
        variables=dict(body.get("variables") or {}),
        resources=resources,
        outputs=dict(body.get("outputs") or {}),
    )


def resource_order(spec: ProgramSpec) -> list[str]:
    """Resources in registration order: dependencies first (through variables too), else file order."""

    def resource_deps(raw: Any, seen_vars: set[str]) -> set[str]:
        names: set[str] = set()
        _refs_in(raw, names)
        found: set[str] = set()
        for name in names:
            if name in spec.resources:
                found.add(name)
            elif name in spec.variables and name not in seen_vars:
                found |= resource_deps(spec.variables[name], seen_vars | {name})
        return found

    for decl in spec.resources.values():
        deps = resource_deps([decl.properties, decl.options], set())
        deps.discard(decl.name)
        decl.deps = [n for n in spec.resources if n in deps]
        prop_deps = resource_deps(decl.properties, set())
        decl.property_deps = [n for n in spec.resources if n in prop_deps and n != decl.name]
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(name: str, stack: list[str]) -> None:
        mark = state.get(name, 0)
        if mark == 2:
            return
        if mark == 1:
            raise ProgramError("circular reference: " + " -> ".join([*stack, name]))
        state[name] = 1
        for dep in spec.resources[name].deps:
            visit(dep, [*stack, name])
        state[name] = 2
        order.append(name)

    for name in spec.resources:
        visit(name, [])
    return order


def _type_value(name: str, decl: dict[str, Any], value: Any) -> Any:
    kind = str(decl.get("type", "")).lower()
    text = value if isinstance(value, str) else None
    try:
        if kind in ("integer", "int") and text is not None:
            return int(text)
        if kind == "number" and text is not None:
            return float(text) if "." in text else int(text)
        if kind == "boolean" and text is not None:
            if text not in ("true", "false"):
                raise ValueError(text)
            return text == "true"
        if kind in ("array", "object", "list<string>") and text is not None:
            return json.loads(text)
    except ValueError as exc:
        raise CliError(f"Stack config value for '{name}' must be of type '{kind}'") from exc
    return value


def program_config(
    spec: ProgramSpec, project: str, stack: str, stack_config: dict[str, tuple[Any, bool]]
) -> dict[str, Any]:
    """Config values visible to the program, by short name (project namespace) and full key.

    ``stack_config`` maps full keys to (plaintext value, secret). Missing declared keys without a default
    are an error worded like pkg/workspace/config.go.
    """
    values: dict[str, Any] = {}
    for key, (value, secret) in stack_config.items():
        wrapped = Secret(value) if secret else value
        values[key] = wrapped
        ns, _, short = key.partition(":")
        if ns == project:
            values[short] = wrapped
    missing = []
    for name, decl in spec.config_decls.items():
        full = name if ":" in name else f"{project}:{name}"
        short = name.split(":", 1)[1] if name.startswith(project + ":") else name
        if full in stack_config:
            value, secret = stack_config[full]
            typed = _type_value(short, decl, value)
        elif "default" in decl or "value" in decl:
            typed, secret = decl.get("default", decl.get("value")), False
        else:
            missing.append(short)
            continue
        wrapped = Secret(typed) if secret or decl.get("secret") else typed
        values[full] = wrapped
        values[short] = wrapped
    if missing:
        word = "value" if len(missing) == 1 else "values"
        if len(missing) == 1:
            listed = f"'{missing[0]}'"
        else:
            listed = ", ".join(f"'{k}'" for k in missing[:-1]) + f" and '{missing[-1]}'"
        raise CliError(f"Stack '{stack}' is missing configuration {word} {listed}")
    return values


class Evaluator:
    """Evaluates expressions against config, variables and the resources registered so far."""

    def __init__(self, spec: ProgramSpec, config_values: dict[str, Any]) -> None:
        self.spec = spec
        self.config = config_values
        self.resources: dict[str, ResourceView] = {}
        self._variables: dict[str, Any] = {}
        self._evaluating: set[str] = set()

    def evaluate(self, raw: Any) -> Any:
        """A plain value (property, output, ``protect``): a bare resource reference is refused."""
        value = self._eval(raw)
        _reject_resources(value)
        return value

    def resource_option(self, raw: Any, option: str) -> ResourceView:
        """A resource-valued option (``parent: ${res}``); errors worded like pulumi-yaml's."""
        value = self._eval(raw)
        if has_unknown(value):
            raise ProgramError(f"resource option {option}: resource cannot be an output")
        return _as_resource(value, option)

    def resource_list_option(self, raw: Any, option: str) -> list[ResourceView]:
        """A list-of-resources option (``dependsOn: [${a}, ${b}]``)."""
        value = self._eval(raw)
        if has_unknown(value) or is_secret_value(value):
            raise ProgramError(f"resource option {option} value must be a list of resource, not an output")
        if not isinstance(value, list):
            raise ProgramError(f"resource option {option} value must be a list of resources")
        return [_as_resource(item, option) for item in value]

    def _eval(self, raw: Any) -> Any:
        if isinstance(raw, str):
            return self._interpolate(raw)
        if isinstance(raw, list):
            return [self._eval(v) for v in raw]
        if isinstance(raw, dict):
            if len(raw) == 1:
                ((key, arg),) = raw.items()
                if isinstance(key, str) and key.startswith("fn::"):
                    return self._call(key[4:], self.evaluate(arg))
            return {str(k): self._eval(v) for k, v in raw.items()}
        return raw

    def _interpolate(self, text: str) -> Any:
        matches = list(_INTERP.finditer(text))
        if len(matches) == 1 and matches[0].group(1) is not None and matches[0].span() == (0, len(text)):
            return self._lookup(matches[0].group(1).strip())
        parts: list[Any] = []
        last = 0
        for match in matches:
            parts.append(text[last : match.start()])
            parts.append("${" if match.group(1) is None else self._lookup(match.group(1).strip()))
            last = match.end()
        parts.append(text[last:])
        _reject_resources(parts)
        if any(p is UNKNOWN or has_unknown(p) for p in parts):
            return UNKNOWN
        secret = any(is_secret_value(p) for p in parts)
        joined = "".join(_to_text(plain(p)) for p in parts)
        return Secret(joined) if secret else joined

    def _lookup(self, expr: str) -> Any:
        root = _root_name(expr)
        rest = parse_property_path(expr[len(root) :].lstrip(".")) if len(expr) > len(root) else []
        value: Any
        if root in self.spec.variables:
            value = self._variable(root)
        elif root in self.resources:
            value = self.resources[root]
        elif root in self.spec.resources:
            raise ProgramError(f"resource {root!r} is referenced before it was registered")
        elif root in self.config:
            value = self.config[root]
        else:
            raise ProgramError(f'resource, variable, or config value "{root}" not found')
        if isinstance(value, ResourceView) and rest:
            head, rest = rest[0], rest[1:]
            value = self._resource_property(value, head, expr)
        return _index(value, rest, expr)

    def _resource_property(self, view: ResourceView, head: PathSegment, expr: str) -> Any:
        if head == "id":
            return view.id
        if head == "urn":
            return view.urn
        if view.outputs is UNKNOWN:  # type: ignore[comparison-overlap]
            return UNKNOWN
        if isinstance(head, str) and head in view.outputs:
            return view.outputs[head]
        return UNKNOWN if has_unknown(view.outputs) else self._missing(expr)

    def _missing(self, expr: str) -> Any:
        raise ProgramError(f'property "{expr}" does not exist')

    def _variable(self, name: str) -> Any:
        if name not in self._variables:
            if name in self._evaluating:
                raise ProgramError(f"circular reference in variable {name!r}")
            self._evaluating.add(name)
            try:
                self._variables[name] = self._eval(self.spec.variables[name])
            finally:
                self._evaluating.discard(name)
        return self._variables[name]

    def _call(self, name: str, arg: Any) -> Any:
        if has_unknown(arg):
            return Secret(UNKNOWN) if name == "secret" else UNKNOWN
        value, secret = plain(arg), is_secret_value(arg)
        if name == "secret":
            return Secret(value)
        if name == "join" and isinstance(value, list) and len(value) == 2:
            result: Any = str(value[0]).join(_to_text(v) for v in value[1])
        elif name == "split" and isinstance(value, list) and len(value) == 2:
            result = str(value[1]).split(str(value[0]))
        elif name == "select" and isinstance(value, list) and len(value) == 2:
            result = value[1][int(value[0])]
        elif name == "toJSON":
            result = json.dumps(value, separators=(",", ":"))
        elif name == "toBase64":
            result = base64.b64encode(str(value).encode("utf-8")).decode("ascii")
        else:
            raise ProgramError(f"unsupported or malformed function fn::{name}")
        return Secret(result) if secret else result


def _reject_resources(value: Any) -> None:
    """Refuse a resource where the fake needs a plain value (see the module docstring)."""
    if isinstance(value, ResourceView):
        name = value.urn.rsplit("::", 1)[1]
        raise ProgramError(f"cannot use resource {name!r} as a value; reference one of its properties")
    if isinstance(value, list):
        for item in value:
            _reject_resources(item)
    elif isinstance(value, dict):
        for item in value.values():
            _reject_resources(item)


_GO_TYPE_NAMES = {
    str: "string",
    bool: "bool",
    int: "float64",
    float: "float64",
    list: "[]interface {}",
    dict: "map[string]interface {}",
}
"""How pulumi-yaml's ``expected resource, got %v`` names a decoded YAML value's Go type."""


def _as_resource(value: Any, option: str) -> ResourceView:
    if isinstance(value, ResourceView):
        return value
    if is_secret_value(value):
        raise ProgramError(f"resource option {option}: resource cannot be an output")
    go_type = _GO_TYPE_NAMES.get(type(value), "<nil>")
    raise ProgramError(f"resource option {option}: expected resource, got {go_type}")


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return "" if value is None else str(value)


def _index(value: Any, path: list[PathSegment], expr: str) -> Any:
    for seg in path:
        if value is UNKNOWN:
            return UNKNOWN
        if isinstance(value, Secret):
            return Secret(_index(value.value, [seg], expr))
        if isinstance(value, dict) and isinstance(seg, str) and seg in value:
            value = value[seg]
        elif isinstance(value, list) and isinstance(seg, int) and seg < len(value):
            value = value[seg]
        else:
            raise ProgramError(f'property "{expr}" does not exist')
    return value
