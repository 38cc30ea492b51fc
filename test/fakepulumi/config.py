"""Stack configuration: keys, property paths, ``--path`` setting and decryption.

A stack's config is kept as the raw YAML of ``Pulumi.<stack>.yaml``'s ``config:`` block: a plain value
is a string, a secret is ``{"secure": "<ciphertext>"}``, an object is a nested dict/list whose leaves
may be secure. This mirrors sdk/go/common/resource/config (map.go, object.go, value.go): path
setting coerces nested ``"true"``/``"false"``/integers, array indices may only append, and a
top-level key with ``--path`` but a single segment is stored verbatim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .errors import CliError

Raw = Any  # str | int | bool | None | dict[str, Raw] | list[Raw]
PathSegment = str | int

_INT = re.compile(r"^-?(0|[1-9][0-9]*)$")


def parse_property_path(text: str) -> list[PathSegment]:
    """Parse ``a.b[0]["c.d"]`` into ``["a", "b", 0, "c.d"]`` (Pulumi PropertyPath syntax)."""
    segments: list[PathSegment] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == "[":
            if i + 1 < n and text[i + 1] == '"':
                j, buf = i + 2, []
                while j < n and text[j] != '"':
                    if text[j] == "\\" and j + 1 < n:
                        j += 1
                    buf.append(text[j])
                    j += 1
                if j + 1 >= n or text[j + 1] != "]":
                    raise CliError(f"invalid property path {text!r}: missing closing bracket")
                segments.append("".join(buf))
                i = j + 2
            else:
                j = text.find("]", i)
                if j < 0 or not text[i + 1 : j].isdigit():
                    raise CliError(f"invalid property path {text!r}: expected an array index")
                segments.append(int(text[i + 1 : j]))
                i = j + 1
            if i < n and text[i] == ".":
                i += 1
        else:
            j = i
            while j < n and text[j] not in ".[":
                j += 1
            if j == i:
                raise CliError(f"invalid property path {text!r}: empty segment")
            segments.append(text[i:j])
            i = j + 1 if j < n and text[j] == "." else j
    return segments


def split_key(key: str) -> tuple[str, str]:
    """``ns:name`` -> (ns, name)."""
    ns, sep, name = key.partition(":")
    if not sep or not ns:
        raise CliError(
            f"could not parse {key!r} as a configuration key (configuration keys should be of the "
            "form `<namespace>:<name>`)"
        )
    return ns, name


def parse_config_key(key: str, path: bool, project: str) -> str:
    """Qualify a key with the project namespace, as pkg/cmd/pulumi/config/io.go parseConfigKey does."""
    if path:
        cut = min((i for i in (key.find("["), key.find(".")) if i > 0), default=-1)
        if cut > 0:
            top = parse_config_key(key[:cut], False, project)
            return top + key[cut:]
    if ":" not in key:
        return f"{project}:{key}"
    split_key(key)
    return key


def _coerce(value: str) -> Raw:
    if value in ("true", "false"):
        return value == "true"
    if _INT.match(value):
        return int(value)
    return value


def _is_secure(raw: Raw) -> bool:
    return isinstance(raw, dict) and len(raw) == 1 and isinstance(raw.get("secure"), str)


def _new_container(segment: PathSegment) -> Raw:
    return [] if isinstance(segment, int) else {}


def _set_nested(node: Raw, prefix: list[PathSegment], path: list[PathSegment], value: Raw) -> Raw:
    if not path:
        return value
    head = path[0]
    if not isinstance(node, (list, dict)) or _is_secure(node):
        if node is None or len(prefix) == 1:
            node = _new_container(head)
        else:
            kind = "an array" if isinstance(head, int) else "a map"
            raise CliError(f"{_render_path(prefix)}: expected {kind}")
    here = [*prefix, head]
    if isinstance(node, list):
        if not isinstance(head, int):
            raise CliError(f"{_render_path(here)}: key for an array must be an int")
        if head > len(node):
            raise CliError(f"{_render_path(here)}: array index out of range")
        if head == len(node):
            node.append(None)
        node[head] = _set_nested(node[head], here, path[1:], value)
        return node
    if not isinstance(head, str):
        raise CliError(f"{_render_path(here)}: key for a map must be a string")
    node[head] = _set_nested(node.get(head), here, path[1:], value)
    return node


def _render_path(path: list[PathSegment]) -> str:
    out = ""
    for seg in path:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else seg)
    return out


def set_value(cfg: dict[str, Raw], key: str, value: Raw, path: bool) -> None:
    """Set ``key`` (already namespace-qualified) to a raw value (a string or ``{"secure": ...}``)."""
    if not path:
        cfg[key] = value
        return
    ns, name = split_key(key)
    segments = parse_property_path(name)
    if not segments or not isinstance(segments[0], str):
        raise CliError(f"invalid config key {key!r}: the first path segment must be a name")
    root_key = f"{ns}:{segments[0]}"
    if len(segments) == 1:
        cfg[root_key] = value
        return
    leaf = _coerce(value) if isinstance(value, str) else value
    cfg[root_key] = _set_nested(cfg.get(root_key), segments[:1], segments[1:], leaf)


def remove_value(cfg: dict[str, Raw], key: str, path: bool) -> None:
    if not path:
        cfg.pop(key, None)
        return
    ns, name = split_key(key)
    segments = parse_property_path(name)
    root_key = f"{ns}:{segments[0]}"
    if len(segments) == 1:
        cfg.pop(root_key, None)
        return
    node = cfg.get(root_key)
    for seg in segments[1:-1]:
        if isinstance(node, dict) and isinstance(seg, str):
            node = node.get(seg)
        elif isinstance(node, list) and isinstance(seg, int) and seg < len(node):
            node = node[seg]
        else:
            return
    last = segments[-1]
    if isinstance(node, dict) and isinstance(last, str):
        node.pop(last, None)
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        del node[last]


def is_secret(raw: Raw) -> bool:
    if _is_secure(raw):
        return True
    if isinstance(raw, dict):
        return any(is_secret(v) for v in raw.values())
    if isinstance(raw, list):
        return any(is_secret(v) for v in raw)
    return False


def is_object(raw: Raw) -> bool:
    return isinstance(raw, (dict, list)) and not _is_secure(raw)


def _scalar_text(raw: Raw) -> str:
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if raw is None:
        return ""
    return str(raw)


def decrypt(raw: Raw, decrypt_fn: Callable[[str], str]) -> Raw:
    """The plaintext structure: secure leaves replaced by their decrypted strings."""
    if _is_secure(raw):
        return decrypt_fn(raw["secure"])
    if isinstance(raw, dict):
        return {k: decrypt(v, decrypt_fn) for k, v in raw.items()}
    if isinstance(raw, list):
        return [decrypt(v, decrypt_fn) for v in raw]
    return raw


def value_text(raw: Raw, decrypt_fn: Callable[[str], str]) -> str:
    """The value as the CLI prints it: objects as compact JSON, scalars as strings."""
    plain = decrypt(raw, decrypt_fn)
    if is_object(raw):
        return json.dumps(plain, separators=(",", ":"), ensure_ascii=False)
    return _scalar_text(plain)


def json_entry(raw: Raw, decrypt_fn: Callable[[str], str], show_secrets: bool) -> dict[str, Any]:
    """One entry of ``pulumi config --json``: value (elided for hidden secrets), objectValue, secret."""
    secret = is_secret(raw)
    entry: dict[str, Any] = {}
    if not secret or show_secrets:
        entry["value"] = value_text(raw, decrypt_fn)
        if is_object(raw):
            entry["objectValue"] = decrypt(raw, decrypt_fn)
    entry["secret"] = secret
    return entry


def encrypt_object(value: Raw, encrypt_fn: Callable[[str], str]) -> Raw:
    """Turn a plain object into one whose string leaves are all secure (``--json`` secret objects)."""
    if isinstance(value, dict):
        return {k: encrypt_object(v, encrypt_fn) for k, v in value.items()}
    if isinstance(value, list):
        return [encrypt_object(v, encrypt_fn) for v in value]
    return {"secure": encrypt_fn(_scalar_text(value) if not isinstance(value, str) else value)}
