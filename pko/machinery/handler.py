"""Event handlers (controller-runtime's ``pkg/handler``): an informer event becomes queue keys.

A controller's watch (:class:`Watch`) is an informer, an optional key mapping and an optional
predicate; :class:`Enqueuer` is the one handler the manager installs for it. Handlers only enqueue
keys: they never read or write anything else, so a slow reconcile never holds up a cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pko.machinery.informer import SharedInformer
from pko.machinery.predicates import Predicate
from pko.machinery.store import DeletedFinalStateUnknown, Obj, meta_namespace_key

__all__ = ["Enqueuer", "MapKeys", "Watch"]

# Which keys an event on an object should enqueue.
MapKeys = Callable[[Obj], Iterable[str]]


@dataclass(frozen=True, slots=True)
class Watch:
    """One event source of a controller: ``informer``'s events, filtered by ``predicate``, enqueue
    ``map_keys(obj)`` (``None``: the object's own key)."""

    informer: SharedInformer
    map_keys: MapKeys | None
    predicate: Predicate | None


class Enqueuer:
    """The only kind of event handler the manager installs: filter, map to keys, enqueue.

    Hot path for a cold start (one ``on_add`` per cached object), so it stays small: no
    allocation beyond the keys themselves when there is no mapping.
    """

    __slots__ = ("_add", "_map", "_pred")

    def __init__(self, add: Callable[[str], None], watch: Watch) -> None:
        self._add = add
        self._map = watch.map_keys
        self._pred = watch.predicate

    def on_add(self, obj: Obj) -> None:
        if self._pred is not None and not self._pred(None, obj):
            return
        if self._map is None:
            self._add(meta_namespace_key(obj))
        else:
            for key in self._map(obj):
                self._add(key)

    def on_update(self, old: Obj, new: Obj) -> None:
        if self._pred is not None and not self._pred(old, new):
            return
        if self._map is None:
            self._add(meta_namespace_key(new))
            return
        # Both: an owner reference or an indexed field may have moved from one key to another.
        keys = set(self._map(new))
        keys.update(self._map(old))
        for key in keys:
            self._add(key)

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        last = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if self._pred is not None and not self._pred(last, None):
            return
        if self._map is None:
            self._add(obj.key if isinstance(obj, DeletedFinalStateUnknown) else meta_namespace_key(obj))
        else:
            for key in self._map(last):
                self._add(key)
