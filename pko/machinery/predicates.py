"""Event filters for watches, as controller-runtime's ``predicate`` package, for plain dicts.

A predicate sees ``(old, new)``: ``(None, obj)`` for an add, ``(old, new)`` for an update and
``(last known state, None)`` for a delete. Most predicates here only judge updates and let adds
and deletes pass: an add may be the cache's initial replay after a restart and a delete always
matters, so a controller that filtered them out would miss work (controller-runtime's choice too).
Compose them with :func:`and_`, :func:`or_` and :func:`not_`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pko.machinery.resource import Obj

__all__ = [
    "Predicate",
    "and_",
    "annotation_changed",
    "condition_became",
    "condition_changed",
    "deletion_started",
    "finalizers_changed",
    "generation_changed",
    "labels_changed",
    "not_",
    "or_",
    "owner_references_changed",
]

Predicate = Callable[[Obj | None, Obj | None], bool]


def and_(*predicates: Predicate) -> Predicate:
    """Passes when every predicate passes (and no predicates: always)."""

    def both(old: Obj | None, new: Obj | None) -> bool:
        return all(p(old, new) for p in predicates)

    return both


def or_(*predicates: Predicate) -> Predicate:
    """Passes when any predicate passes (no predicates: never)."""

    def either(old: Obj | None, new: Obj | None) -> bool:
        return any(p(old, new) for p in predicates)

    return either


def not_(predicate: Predicate) -> Predicate:
    def negated(old: Obj | None, new: Obj | None) -> bool:
        return not predicate(old, new)

    return negated


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _update_changed(field: Callable[[Obj], Any]) -> Predicate:
    """Adds and deletes pass; an update passes when ``field`` differs between old and new."""

    def changed(old: Obj | None, new: Obj | None) -> bool:
        if old is None or new is None:
            return True
        return bool(field(old) != field(new))

    return changed


generation_changed: Predicate = _update_changed(lambda o: _meta(o).get("generation"))
generation_changed.__doc__ = """controller-runtime's ``GenerationChangedPredicate``: skip updates
that left the spec alone.

With a status subresource, status writes (including our own) and metadata-only changes do not
bump ``metadata.generation``, so they do not requeue.
"""

labels_changed: Predicate = _update_changed(lambda o: _meta(o).get("labels") or {})
finalizers_changed: Predicate = _update_changed(lambda o: sorted(_meta(o).get("finalizers") or []))
owner_references_changed: Predicate = _update_changed(lambda o: _meta(o).get("ownerReferences") or [])


def annotation_changed(key: str) -> Predicate:
    """An update changed (or added, or removed) annotation ``key``: e.g. the reconciliation request."""
    return _update_changed(lambda o: (_meta(o).get("annotations") or {}).get(key))


def deletion_started(old: Obj | None, new: Obj | None) -> bool:
    """An update set ``metadata.deletionTimestamp`` (a finalizer now has work); adds and deletes pass."""
    if old is None or new is None:
        return True
    return not _meta(old).get("deletionTimestamp") and bool(_meta(new).get("deletionTimestamp"))


def _condition(obj: Obj, type_: str) -> Obj | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return dict(condition)
    return None


def condition_changed(type_: str) -> Predicate:
    """An update changed condition ``type_``'s status, reason or message (not just a timestamp)."""

    def key(obj: Obj) -> tuple[Any, ...] | None:
        c = _condition(obj, type_)
        return None if c is None else (c.get("status"), c.get("reason"), c.get("message"))

    return _update_changed(key)


def condition_became(type_: str, status: str) -> Predicate:
    """An update (or an add) shows condition ``type_`` with ``status`` that the old object did not.

    E.g. ``condition_became("Complete", "True")``: an Update finished. An add passes when the
    condition already holds (after a restart the controller still sees finished work); deletes
    do not pass: they are not a transition.
    """

    def became(old: Obj | None, new: Obj | None) -> bool:
        if new is None:
            return False
        now = _condition(new, type_)
        if now is None or now.get("status") != status:
            return False
        before = _condition(old, type_) if old is not None else None
        return before is None or before.get("status") != status

    return became
