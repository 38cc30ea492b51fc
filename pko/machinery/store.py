"""A thread-safe keyed store of Kubernetes objects with secondary indexes (client-go's ``Indexer``).

Objects are plain dicts exactly as decoded from the API's JSON (after the informer's transform):
no model classes, so that a cache of thousands of objects stays small.

Invariants:
- ``_items`` maps key -> object; ``_indices[name][value]`` is the set of keys whose object yields
  ``value`` from index function ``name``; both change together under ``_lock``.
- Index values for an object are computed *before* anything is mutated, so an index function
  that raises leaves the store unchanged.
- The store hands out the stored dicts themselves, not copies. Callers must treat them as
  read-only (copy before changing), as with client-go's cache.
"""

from __future__ import annotations

import builtins
import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
KeyFunc = Callable[[Obj], str]
IndexFunc = Callable[[Obj], Sequence[str]]

NAMESPACE_INDEX = "namespace"
OWNER_UID_INDEX = "owner-uid"
CONTROLLER_UID_INDEX = "controller-uid"


class ObjectKeyError(ValueError):
    """An object lacks the metadata its key is made of."""


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """A tombstone: the object was deleted while the watch was broken, so its final state is unknown.

    ``obj`` is the last state the cache saw; ``key`` is its store key.
    """

    key: str
    obj: Obj


def meta_namespace_key(obj: Obj) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ObjectKeyError(f"object has no metadata.name: kind={obj.get('kind')!r}")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


def deletion_handling_key(obj: Obj | DeletedFinalStateUnknown) -> str:
    """The key of an object or of a tombstone (handlers get either in ``on_delete``)."""
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    return meta_namespace_key(obj)


def split_key(key: str) -> tuple[str | None, str]:
    """Split a store key into ``(namespace or None, name)``."""
    namespace, sep, name = key.partition("/")
    if not sep:
        return None, key
    if not namespace or not name or "/" in name:
        raise ValueError(f"invalid store key {key!r}")
    return namespace, name


def object_key(namespace: str | None, name: str) -> str:
    """The store key for ``namespace``/``name`` (the inverse of :func:`split_key`)."""
    return f"{namespace}/{name}" if namespace else name


# ----- index functions ---------------------------------------------------------------------------


def index_by_namespace(obj: Obj) -> list[str]:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return [namespace] if namespace else []


def index_by_owner_uid(obj: Obj) -> list[str]:
    """UIDs of every owner reference."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [ref["uid"] for ref in refs if ref.get("uid")]


def index_by_controller_uid(obj: Obj) -> list[str]:
    """UID of the controlling owner reference (``controller: true``), if any."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [ref["uid"] for ref in refs if ref.get("controller") and ref.get("uid")]


@functools.cache  # the same arguments give the same function, so shared informers can compare them
def index_by_owner(kind: str, *, api_group: str | None = None, controller_only: bool = False) -> IndexFunc:
    """Index by the store key (``namespace/name``) of owners of ``kind`` (optionally in ``api_group``).

    Owner references are always in the owned object's namespace, so the key is the owner's key:
    ``by_index(name, stack_key)`` returns what a Stack owns without knowing its UID.
    """

    def index(obj: Obj) -> list[str]:
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace")
        out: list[str] = []
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") != kind or (controller_only and not ref.get("controller")):
                continue
            if api_group is not None and str(ref.get("apiVersion", "")).rpartition("/")[0] != api_group:
                continue
            if ref.get("name"):
                out.append(object_key(namespace, ref["name"]))
        return out

    return index


@functools.cache
def index_by_field(path: str, *, namespaced: bool = False) -> IndexFunc:
    """Index by the value at a dotted field path such as ``spec.programRef.name``.

    A scalar yields one value, a list of scalars one value per element, a missing field none.
    With ``namespaced=True`` values are prefixed with the object's namespace (``ns/value``), which
    is what a lookup like "Stacks in this namespace that use Program X" needs.
    """
    parts = path.split(".")
    if not path or not all(parts):
        raise ValueError(f"invalid field path {path!r}")

    def index(obj: Obj) -> list[str]:
        value: Any = obj
        for part in parts:
            if not isinstance(value, dict):
                return []
            value = value.get(part)
        values = value if isinstance(value, list) else [value]
        out = [_scalar_str(v) for v in values if v is not None and not isinstance(v, dict | list)]
        if namespaced:
            namespace = (obj.get("metadata") or {}).get("namespace")
            out = [object_key(namespace, v) for v in out]
        return out

    return index


def _scalar_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def resource_version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


# ----- the store ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ReplaceResult:
    """What :meth:`Indexer.replace` changed: the differences an informer emits after a relist."""

    added: list[Obj] = field(default_factory=list)
    updated: list[tuple[Obj, Obj]] = field(default_factory=list)
    deleted: list[DeletedFinalStateUnknown] = field(default_factory=list)


class Indexer:
    """Thread-safe store keyed by ``key_func`` with named secondary indexes."""

    def __init__(
        self,
        key_func: KeyFunc = meta_namespace_key,
        indexers: Mapping[str, IndexFunc] | None = None,
    ) -> None:
        self._key_func = key_func
        self._lock = threading.RLock()
        self._items: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}

    # --- writes

    def add(self, obj: Obj) -> Obj | None:
        """Insert or replace ``obj``; returns the object it replaced, if any."""
        key = self._key_func(obj)
        with self._lock:
            values = self._index_values(obj)
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, self._index_values(old))
            self._items[key] = obj
            self._index(key, values)
            return old

    update = add

    def delete(self, obj: Obj | DeletedFinalStateUnknown) -> Obj | None:
        """Remove the object with ``obj``'s key; returns the removed object, if any."""
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else self._key_func(obj)
        return self.delete_key(key)

    def delete_key(self, key: str) -> Obj | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, self._index_values(old))
            return old

    def replace(self, objs: Iterable[Obj]) -> ReplaceResult:
        """Make the store hold exactly ``objs`` and report the differences.

        An object counts as updated when its ``metadata.resourceVersion`` changed; keys that
        disappeared are reported as tombstones carrying the last known state.
        """
        new_items: dict[str, Obj] = {}
        for obj in objs:
            new_items[self._key_func(obj)] = obj
        new_indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}
        for key, obj in new_items.items():
            for name, func in self._indexers.items():
                for value in func(obj):
                    new_indices[name].setdefault(value, set()).add(key)
        result = ReplaceResult()
        with self._lock:
            old_items = self._items
            for key, obj in new_items.items():
                old = old_items.get(key)
                if old is None:
                    result.added.append(obj)
                elif resource_version(old) != resource_version(obj):
                    result.updated.append((old, obj))
            for key, old in old_items.items():
                if key not in new_items:
                    result.deleted.append(DeletedFinalStateUnknown(key, old))
            if self._indexers.keys() != new_indices.keys():  # indexers added concurrently
                new_indices = self._build_indices(new_items, self._indexers)
            self._items = new_items
            self._indices = new_indices
        return result

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions; existing objects are indexed at once. Names must be new."""
        with self._lock:
            clash = set(indexers) & set(self._indexers)
            if clash:
                raise ValueError(f"indexers already exist: {sorted(clash)}")
            built = self._build_indices(self._items, indexers)
            self._indexers.update(indexers)
            self._indices.update(built)

    # --- reads

    def get(self, obj: Obj) -> Obj | None:
        return self.get_by_key(self._key_func(obj))

    def get_by_key(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def list(self) -> builtins.list[Obj]:
        with self._lock:
            return list(self._items.values())

    def list_keys(self) -> builtins.list[str]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def indexer_names(self) -> builtins.list[str]:
        with self._lock:
            return list(self._indexers)

    def indexer_func(self, index_name: str) -> IndexFunc:
        with self._lock:
            return self._indexer(index_name)

    def index(self, index_name: str, obj: Obj) -> builtins.list[Obj]:
        """Objects sharing at least one value of index ``index_name`` with ``obj``."""
        with self._lock:
            func = self._indexer(index_name)
            keys: set[str] = set()
            for value in func(obj):
                keys |= self._indices[index_name].get(value, set())
            return [self._items[k] for k in sorted(keys)]

    def by_index(self, index_name: str, value: str) -> builtins.list[Obj]:
        """Objects whose index function ``index_name`` yields ``value``, ordered by key."""
        with self._lock:
            self._indexer(index_name)
            return [self._items[k] for k in sorted(self._indices[index_name].get(value, ()))]

    def index_keys(self, index_name: str, value: str) -> builtins.list[str]:
        with self._lock:
            self._indexer(index_name)
            return sorted(self._indices[index_name].get(value, ()))

    def list_index_func_values(self, index_name: str) -> builtins.list[str]:
        """Every value index ``index_name`` currently holds."""
        with self._lock:
            self._indexer(index_name)
            return sorted(self._indices[index_name])

    # --- internals (call with the lock held)

    def _indexer(self, index_name: str) -> IndexFunc:
        func = self._indexers.get(index_name)
        if func is None:
            raise KeyError(f"no indexer named {index_name!r}")
        return func

    def _index_values(self, obj: Obj) -> builtins.list[tuple[str, Sequence[str]]]:
        return [(name, func(obj)) for name, func in self._indexers.items()]

    def _index(self, key: str, values: builtins.list[tuple[str, Sequence[str]]]) -> None:
        for name, vals in values:
            index = self._indices[name]
            for value in vals:
                index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, values: builtins.list[tuple[str, Sequence[str]]]) -> None:
        for name, vals in values:
            index = self._indices[name]
            for value in vals:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    @staticmethod
    def _build_indices(
        items: Mapping[str, Obj], indexers: Mapping[str, IndexFunc]
    ) -> dict[str, dict[str, set[str]]]:
        built: dict[str, dict[str, set[str]]] = {name: {} for name in indexers}
        for key, obj in items.items():
            for name, func in indexers.items():
                for value in func(obj):
                    built[name].setdefault(value, set()).add(key)
        return built


def default_indexers() -> dict[str, IndexFunc]:
    """Indexes most controllers want: by namespace, owner UID and controller UID."""
    return {
        NAMESPACE_INDEX: index_by_namespace,
        OWNER_UID_INDEX: index_by_owner_uid,
        CONTROLLER_UID_INDEX: index_by_controller_uid,
    }
