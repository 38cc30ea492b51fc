"""Read-your-writes over an informer cache.

A controller's own write reaches its cache only when the watch delivers it; a reconcile that runs
before then (the write itself often triggers one) reads an older object and may redo what it just
did: start a second operation, write the same status again. :class:`RecentWrites` remembers the
object each write returned until the cache holds that version or a later one.

This is the operator's one guard against stale reads. Each :class:`~pko.machinery.informer.SharedInformer`
owns one (``informer.wrote(obj)`` after a write, ``informer.latest(key)`` to read), shaped by the
informer's own transform and cleared by its own watch events, so every controller sharing the
informer reads through every write any of them made.
"""

from __future__ import annotations

from collections.abc import Callable

from pko.machinery.store import (
    Obj,
    clone,
    meta_namespace_key,
    resource_version,
    strip_managed_fields,
    without_managed_fields,
)

__all__ = ["RecentWrites", "newer"]


class RecentWrites:
    """Objects this controller wrote that its cache may not show yet, by cache key.

    An entry lives until the cache catches up (seen by :meth:`latest` or :meth:`caught_up`) or the
    object goes, so at most one per object written and not yet watched back.
    """

    def __init__(self, transform: Callable[[Obj], Obj] | None = strip_managed_fields) -> None:
        self._objects: dict[str, Obj] = {}
        self._transform = transform

    def __len__(self) -> int:
        return len(self._objects)

    def wrote(self, obj: Obj) -> Obj:
        """Remember ``obj`` as the API server returned it from a write (shaped by the cache's
        transform); returns ``obj`` untouched."""
        if self._transform is strip_managed_fields:  # the default: the fields dropped before copying
            kept = clone(without_managed_fields(obj))
        else:
            kept = clone(obj)
            kept = self._transform(kept) if self._transform else kept
        self._objects[meta_namespace_key(obj)] = kept
        return obj

    def latest(self, key: str, cached: Obj | None) -> Obj | None:
        """``cached``, or (a copy of) what was last written if the cache has not caught up with it."""
        written = self._objects.get(key)
        if cached is None or written is None or not newer(written, cached):
            self._objects.pop(key, None)
            return cached
        copied: Obj = clone(written)
        return copied

    def caught_up(self, cached: Obj, *, gone: bool = False) -> None:
        """Forget the write of ``cached``'s object once the cache holds it (or the object is gone):
        for informer event handlers, so entries do not wait for the next reconcile."""
        key = meta_namespace_key(cached)
        written = self._objects.get(key)
        if written is not None and (gone or not newer(written, cached)):
            self._objects.pop(key, None)


def newer(a: Obj, b: Obj) -> bool:
    """Whether ``a`` is a later version than ``b``: resourceVersions compared as numbers, which
    every apiserver uses; if one is not a number, no (the cache wins)."""
    try:
        return int(resource_version(a) or 0) > int(resource_version(b) or 0)
    except ValueError:
        return False
