"""``pulumi import``: what to import (arguments or ``--file``) and the Pulumi YAML code it generates.

Follows pkg/cmd/pulumi/operations/import.go: the same argument errors, the import file's
``resources``/``nameTable`` shape with ``name``/``logicalName`` defaulting to each other, and its
validation errors collected into a go-multierror list. Parents, providers, components and converters
(``--from``) are not modelled and are refused. Code generation follows pulumi-yaml's program
generator: resources under ``resources:``, tokens collapsed (``test:index:Echo`` -> ``test:Echo``),
``properties:`` then ``options: {protect: true}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from .errors import CliError

_MISSING = "an inline resource must be specified if no converter or import file is used, missing "


@dataclass(frozen=True)
class ImportSpec:
    type: str
    name: str  # the variable name in generated code
    id: str
    logical_name: str = ""  # the URN's name; defaults to ``name``

    @property
    def urn_name(self) -> str:
        return self.logical_name or self.name


def specs_from_args(args: list[str], has_file: bool, has_from: bool) -> list[ImportSpec] | None:
    """The inline resource, or None when ``--file`` supplies them; argument errors worded like the CLI."""
    if has_file:
        if args:
            raise CliError("an inline resource may not be specified in conjunction with an import file")
        if has_from:
            raise CliError("a converter may not be specified in conjunction with an import file")
        return None
    if has_from:
        raise CliError("the fake pulumi CLI does not model import converters (--from)")
    if len(args) < 3:
        raise CliError(_MISSING + ("type, name, and id", "name and id", "id")[len(args)])
    if len(args) > 3:
        raise CliError("only expected at most three arguments")
    return [ImportSpec(type=args[0], name=args[1], id=args[2])]


def read_import_file(path: str) -> list[dict[str, Any]]:
    """The import file's ``resources`` entries (readImportFile); see :func:`validate_entries`."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CliError(f"could not read import file: {exc}") from exc
    entries = document.get("resources") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise CliError("could not read import file: json: expected an object with a 'resources' list")
    return [entry if isinstance(entry, dict) else {} for entry in entries]


def _describe(index: int, entry: dict[str, Any]) -> str:
    """describeResource: ``resource 'name' of type 'token'`` with whatever is known."""
    label = (
        f"'{entry['name']}'" if entry.get("name") else (f"'{entry['id']}'" if entry.get("id") else str(index))
    )
    return f"resource {label}" + (f" of type '{entry['type']}'" if entry.get("type") else "")


def _entry_errors(index: int, entry: dict[str, Any]) -> list[str]:
    what = _describe(index, entry)
    errors = [f"{what} has no {field}" for field in ("type", "name") if not entry.get(field)]
    if entry.get("component"):
        errors.append(f"{what} is a component: the fake pulumi CLI does not model importing components")
    elif not entry.get("id"):
        errors.append(f"{what} has no ID")
    for option in ("parent", "provider"):
        if entry.get(option):
            errors.append(f"{what} has a {option}: the fake pulumi CLI does not model import {option}s")
    return errors


def validate_entries(entries: list[dict[str, Any]]) -> list[ImportSpec]:
    """parseImportFile (the modelled subset): name/logicalName default to each other, then errors
    about missing fields and ambiguous URNs are collected and reported together."""
    for entry in entries:
        entry["name"] = entry.get("name") or entry.get("logicalName") or ""
        entry["logicalName"] = entry.get("logicalName") or entry["name"]
    errors = [message for i, entry in enumerate(entries) for message in _entry_errors(i, entry)]
    if errors:
        raise CliError(multierror(errors))
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(entries):
        key = (str(entry["type"]), str(entry["logicalName"]))
        if key in seen:
            errors.append(
                f"{_describe(i, entry)} has an ambiguous URN, set name (or logical name) to be unique"
            )
        seen.add(key)
    if errors:
        raise CliError(multierror(errors))
    return [
        ImportSpec(
            type=str(e["type"]), name=str(e["name"]), id=str(e["id"]), logical_name=str(e["logicalName"])
        )
        for e in entries
    ]


def multierror(errors: list[str]) -> str:
    """hashicorp/go-multierror's list format, which the CLI prints after ``error: ``."""
    word = "error" if len(errors) == 1 else "errors"
    points = "\n\t".join(f"* {message}" for message in errors)
    return f"{len(errors)} {word} occurred:\n\t{points}"


# -- code generation ------------------------------------------------------------------------------
def collapse_token(token: str) -> str:
    """pulumi-yaml's collapseToken, e.g. ``fizz:index/buzz:Buzz`` -> ``fizz:Buzz`` and
    ``foo:index:Bar`` -> ``foo:Bar`` (the generator gets the exact token from the PCL program)."""
    parts = token.split(":")
    if len(parts) != 3:
        return token
    module = parts[1].split("/")
    if len(module) == 2 and module[1][:1].upper() + module[1][1:] == parts[2]:
        parts = [parts[0], module[0], parts[2]]
    if parts[1] in ("index", ""):
        parts = [parts[0], parts[2]]
    return ":".join(parts)


def _escape(value: Any) -> Any:
    """Literal ``${`` must be written ``$${`` in Pulumi YAML."""
    if isinstance(value, str):
        return value.replace("${", "$${")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    """Indents block sequences under their key, as pulumi-yaml's encoder does."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


@dataclass(frozen=True)
class Declaration:
    """One imported resource as the generator sees it: plaintext inputs (secrets are written in plain
    text, as pulumi-yaml's generator unwraps ``secret()``)."""

    name: str
    logical_name: str
    type: str
    inputs: dict[str, Any]
    protect: bool


def generate_yaml(resources: list[Declaration]) -> str:
    body: dict[str, Any] = {}
    for res in resources:
        entry: dict[str, Any] = {"type": collapse_token(res.type)}
        if res.logical_name != res.name:
            entry["name"] = res.logical_name
        if res.inputs:
            entry["properties"] = {k: _escape(res.inputs[k]) for k in sorted(res.inputs)}
        if res.protect:
            entry["options"] = {"protect": True}
        body[res.name] = entry
    text = yaml.dump({"resources": body}, Dumper=_Dumper, sort_keys=False, default_flow_style=False, indent=2)
    return str(text)
