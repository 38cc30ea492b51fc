"""Bounded status lists and messages (the limits of :mod:`pko.api.limits`), pure.

Every list the operator copies from an operation into a status goes through :func:`bounded_list`
and every message that names resources through :func:`cap_head` or :func:`cap_tail`, so no object
grows with the program (a write over the API server's size limit fails forever and wedges the
Stack). Invariants of a :class:`Bounded`: ``entries`` is a prefix of the input, in its order,
each entry's ``paths`` a prefix of its own; ``total`` counts the input; ``truncated`` is true exactly
when an entry or a path was left out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pko.api.limits import MAX_LISTED_BYTES, MAX_LISTED_ENTRIES, MAX_LISTED_PATHS

__all__ = ["Bounded", "bounded_list", "cap_head", "cap_tail", "json_size"]

Obj = dict[str, Any]
_ELLIPSIS = "..."


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (UTF-8): what it weighs in the object the API server stores."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass(frozen=True, slots=True)
class Bounded:
    """The listed prefix of a list, how long the whole list is, and whether anything was left out."""

    entries: list[Obj]
    total: int
    truncated: bool


def bounded_list(
    items: Iterable[Mapping[str, Any]],
    *,
    max_entries: int = MAX_LISTED_ENTRIES,
    max_paths: int = MAX_LISTED_PATHS,
    max_bytes: int = MAX_LISTED_BYTES,
) -> Bounded:
    """The first entries of ``items`` (in their order: the caller sorts) while at most ``max_entries``
    fit in ``max_bytes`` of JSON, each with at most ``max_paths`` of its ``paths``."""
    listed: list[Obj] = []
    size, total, truncated, full = 2, 0, False, False  # "[]"
    for item in items:
        total += 1
        if full:
            continue
        entry = dict(item)
        paths = entry.get("paths")
        if isinstance(paths, list) and len(paths) > max_paths:
            entry["paths"] = paths[:max_paths]
            truncated = True
        weight = json_size(entry) + (1 if listed else 0)
        if len(listed) >= max_entries or size + weight > max_bytes:
            full = True
            continue
        listed.append(entry)
        size += weight
    return Bounded(listed, total, truncated or len(listed) < total)


def cap_tail(message: str, limit: int) -> str:
    """``message`` cut to its last ``limit`` characters (an error's last lines say most), marked."""
    if len(message) <= limit:
        return message
    return _ELLIPSIS + message[-(limit - len(_ELLIPSIS)) :]


def cap_head(message: str, limit: int) -> str:
    """``message`` cut to its first ``limit`` characters (a summary leads), marked."""
    if len(message) <= limit:
        return message
    return message[: limit - len(_ELLIPSIS)] + _ELLIPSIS
