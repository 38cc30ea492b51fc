"""Markers that carry CRD-schema facts on model fields, inside ``typing.Annotated``.

Pydantic ignores metadata objects it does not know, so these markers cost nothing at validation
time; ``pko.api.crdgen`` reads them when it turns a model into an OpenAPI v3 structural schema.
They hold only what a Python type cannot say on its own (integer width, list semantics, a
server-side default, "this is one of our extensions").

Every marker is a frozen dataclass, so markers compare by value and are hashable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Format:
    """OpenAPI ``format`` of a scalar, e.g. ``int64``, ``int32`` or ``date-time``."""

    name: str


@dataclass(frozen=True)
class ListMap:
    """A list merged by key under server-side apply (``x-kubernetes-list-type: map``).

    Invariant: every key is a required field of the item model (1.20 refuses a map key that is
    neither required nor defaulted).
    """

    keys: tuple[str, ...]

    def __init__(self, *keys: str) -> None:
        object.__setattr__(self, "keys", keys)


@dataclass(frozen=True)
class ListAtomic:
    """A list replaced as a whole under server-side apply (``x-kubernetes-list-type: atomic``)."""


@dataclass(frozen=True)
class PreserveUnknown:
    """Arbitrary JSON, kept verbatim by the apiserver (``x-kubernetes-preserve-unknown-fields``)."""


@dataclass(frozen=True)
class CrdDefault:
    """A default the apiserver applies on write (and 1.20 accepts).

    Use only where the Go operator's CRD has the same default; otherwise default in the model.
    """

    value: Any


@dataclass(frozen=True)
class Extension:
    """A field that is ours, not the Go operator's; ``why`` names the issue or design note."""

    why: str


@dataclass(frozen=True)
class ApplyConfigurationOf:
    """The field holds a partial object of ``model`` (every field optional, no defaults).

    The Go operator embeds ``WorkspaceApplyConfiguration`` / ``UpdateApplyConfiguration`` in the
    Stack: a template merged over the object the controller builds. The value stays a plain dict
    so a reconciler can merge it; the schema is ``model``'s with ``required`` and ``default``
    removed from our own models (embedded Kubernetes types keep theirs, as in Go).
    """

    model: type[Any]


__all__ = [
    "ApplyConfigurationOf",
    "CrdDefault",
    "Extension",
    "Format",
    "ListAtomic",
    "ListMap",
    "PreserveUnknown",
]
