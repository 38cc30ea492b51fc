"""The markers hack/gen_helm.py puts into config/default's objects, and the Helm text they become.

An object is dumped as YAML with marker scalars at the places values go, then each marker is replaced:
an inline one by an expression, a block one (the whole line) by lines of template. This keeps the
chart's objects config/'s objects, byte for byte where no value applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

# Every marker is a plain YAML scalar made of letters, digits and underscores, which PyYAML writes
# unquoted and never folds, and which no config/ object contains (checked by gen_helm).
MARK = "PKOHELM_"
NS_MARK = MARK + "NAMESPACE"

Obj = dict[str, Any]


@dataclass
class Markers:
    """What each marker in the dumped YAML becomes. ``inline``: the marker token is replaced by an
    expression. ``block``: the line holding the marker (``key: MARKER``, ``- MARKER`` or, for entries
    added to a map, ``MARKER: null``) is replaced by lines, each prefixed by that line's indentation,
    with ``<key>``, ``<n>`` (the indentation's width) and ``<n2>`` (two more) filled in."""

    inline: dict[str, str] = field(default_factory=dict)
    block: dict[str, str] = field(default_factory=dict)

    def new_inline(self, name: str, expr: str) -> str:
        marker = MARK + name
        self.inline[marker] = expr
        return marker

    def new_block(self, name: str, text: str) -> str:
        marker = MARK + name
        self.block[marker] = text
        return marker


_BLOCK_LINE = re.compile(r"^(?P<indent> *)(?:- (?P<item>\w+)|(?P<key>[^\s:]+): (?P<value>\S+))$")


def apply_markers(text: str, markers: Markers) -> str:
    text = text.replace("{{", '{{ "{{" }}')  # a literal `{{` of config/ stays literal under Helm
    out: list[str] = []
    for line in text.splitlines():
        m = _BLOCK_LINE.match(line)
        marker = None
        if m:
            marker = next((t for t in (m["item"], m["value"], m["key"]) if t in markers.block), None)
        if m and marker:
            indent = m["indent"]
            key = "" if marker == m["key"] else m["key"] or ""
            body = markers.block[marker].replace("<key>", key)
            body = body.replace("<n2>", str(len(indent) + 2)).replace("<n>", str(len(indent)))
            out.extend(indent + b for b in body.splitlines())
            continue
        out.append(line)
    inline = {**markers.inline, NS_MARK: "{{ .Release.Namespace }}"}

    def expr(m: re.Match[str]) -> str:
        if m[0] not in inline:
            raise SystemExit(f"gen_helm: marker {m[0]} was not replaced (did PyYAML move or quote it?)")
        return inline[m[0]]

    # Whole tokens (a marker may be a prefix of another: NAME_SA, NAME_SA_ANNOTATIONS).
    return re.sub(MARK + r"\w+", expr, "\n".join(out) + "\n")


def dump(obj: Obj) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100)


# Block texts. `with` renders nothing for an empty value; toYaml keeps the value's shape.
def with_key(value: str) -> str:
    """``key:`` and the value below it, only when the value is not empty."""
    return "{{- with " + value + " }}\n<key>:\n  {{- toYaml . | nindent <n2> }}\n{{- end }}"


def with_items(value: str) -> str:
    """The value's list items (or map entries) at the marker's own indentation, when not empty."""
    return "{{- with " + value + " }}\n{{- toYaml . | nindent <n> }}\n{{- end }}"


def one(items: list[Obj], what: str) -> Obj:
    if len(items) != 1:
        raise SystemExit(f"gen_helm: expected one {what} in config/default, found {len(items)}")
    return items[0]
