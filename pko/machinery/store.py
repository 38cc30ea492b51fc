"""A thread-safe keyed store of Kubernetes objects with secondary indexes (client-go's ``Indexer``).

Objects go in and come out as plain dicts exactly as decoded from the API's JSON (after the
informer's transform), but are *kept* encoded: a decoded object costs about six times its JSON size
in dicts and strings, which puts 10,000 Stacks well over the operator's memory budget, while the
encoded bytes are about its JSON size. Reconcilers read a handful of objects per reconcile, so
decoding on read is cheap where it matters.

Encoding: :mod:`marshal`. Measured on a 2.6 KB (as JSON) Stack, per object: marshal 9 us to
encode / 27-40 us to decode / 2.2 KB; pickle protocol 5 12 / 51 / 2.3 KB; compact JSON
31 / 40-60 / 2.6 KB. marshal's known drawbacks do not apply here: the bytes never leave the process
(so its version-specific format is irrelevant) and are only ever produced by us from our own data
(so its lack of safety against hostile input is irrelevant). It accepts exactly the types JSON
decodes to; a transform returning anything else fails loudly at insert time.

Invariants:
- ``_items`` maps key -> :class:`StoredObject`; ``_indices[name][value]`` is the set of keys whose
  object yields ``value`` from index function ``name``; both change together under ``_lock``.
- A stored entry carries its index values for *every* current indexer, computed from the object
  before encoding (so indexed lookups and removals decode nothing), and its resourceVersion (so a
  relist is diffed without decoding).
- Index values for an object are computed *before* anything is mutated, so an index function
  that raises leaves the store unchanged.
- Every read returns freshly decoded objects: callers own them and may change them freely; the
  cache is unaffected. Two reads of one key give equal, never identical, objects.
"""

from __future__ import annotations

import builtins
import copy
import functools
import marshal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
KeyFunc = Callable[[Obj], str]
IndexFunc = Callable[[Obj], Sequence[str]]
IndexValues = tuple[tuple[str, tuple[str, ...]], ...]
"""``(index name, values)`` for each indexer, in the store's indexer order."""

NAMESPACE_INDEX = "namespace"


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


LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


def strip_managed_fields(obj: Obj) -> Obj:
    """The informers' default transform: drop what no reconciler reads but can dwarf the object itself."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if annotations and LAST_APPLIED_ANNOTATION in annotations:
            del annotations[LAST_APPLIED_ANNOTATION]
    return obj


def without_managed_fields(obj: Obj) -> Obj:
    """What :func:`strip_managed_fields` leaves of ``obj``, without touching ``obj``: a shallow copy
    (its metadata and annotations new dicts, everything else shared), so a deep copy of the result
    does not first copy what the transform drops (a write's answer carries every manager's fields)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    meta = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED_ANNOTATION in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED_ANNOTATION}
    return {**obj, "metadata": meta}


def clone(value: Any) -> Any:
    """A deep copy of decoded JSON (dicts, lists, scalars: what the cache holds): :mod:`marshal`'s
    round trip, in C, several times faster than :func:`copy.deepcopy` on such data; a value marshal
    does not take (a str subclass such as an enum, a set, a model) goes to :func:`copy.deepcopy`."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return copy.deepcopy(value)


# ----- the store ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One cached object as kept: encoded, with what the store and the reflector need undecoded."""

    key: str
    resource_version: str
    data: bytes
    index_values: IndexValues

    def decode(self) -> Obj:
        """A fresh copy of the object, owned by the caller."""
        obj: Obj = marshal.loads(self.data)
        return obj


@dataclass(slots=True)
class ReplaceResult:
    """What :meth:`Indexer.replace` changed: the differences an informer emits after a relist.

    Entries stay encoded; the ``added``/``updated``/``deleted`` views decode all of them at once,
    so code handling many (an informer's cold sync) should iterate the entries and decode one at
    a time.
    """

    added_entries: list[StoredObject] = field(default_factory=list)
    updated_entries: list[tuple[StoredObject, StoredObject]] = field(default_factory=list)
    deleted_entries: list[StoredObject] = field(default_factory=list)

    @property
    def added(self) -> list[Obj]:
        return [e.decode() for e in self.added_entries]

    @property
    def updated(self) -> list[tuple[Obj, Obj]]:
        return [(old.decode(), new.decode()) for old, new in self.updated_entries]

    @property
    def deleted(self) -> list[DeletedFinalStateUnknown]:
        return [DeletedFinalStateUnknown(e.key, e.decode()) for e in self.deleted_entries]


class Indexer:
    """Thread-safe store keyed by ``key_func`` with named secondary indexes.

    The object-level API (``add``, ``get_by_key``, ``by_index``...) encodes and decodes; the
    entry-level API (``encode``, ``put``, ``remove_key``, ``replace_entries``, ``list_entries``)
    lets an informer encode once, diff by resourceVersion and decode only what handlers need.
    """

    def __init__(
        self,
        key_func: KeyFunc = meta_namespace_key,
        indexers: Mapping[str, IndexFunc] | None = None,
    ) -> None:
        self._key_func = key_func
        self._lock = threading.RLock()
        self._items: dict[str, StoredObject] = {}
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}

    # --- entries

    def encode(self, obj: Obj) -> StoredObject:
        """Key, index values and encoding of ``obj``, for :meth:`put` or :meth:`replace_entries`.

        Raises what the key or an index function raises, or ``ValueError`` for an object holding
        something other than JSON types.
        """
        key = self._key_func(obj)
        with self._lock:
            indexers = list(self._indexers.items())
        values = tuple((name, tuple(func(obj))) for name, func in indexers)
        return StoredObject(key, resource_version(obj), marshal.dumps(obj), values)

    def key(self, obj: Obj) -> str:
        """The store key of ``obj`` (by this store's key function)."""
        return self._key_func(obj)

    def put(self, entry: StoredObject) -> StoredObject | None:
        """Insert or replace ``entry``; returns the entry it replaced, if any."""
        with self._lock:
            entry = self._complete(entry)
            old = self._items.get(entry.key)
            if old is not None:
                self._unindex(old.key, old.index_values)
            self._items[entry.key] = entry
            self._index(entry.key, entry.index_values)
            return old

    def remove_key(self, key: str) -> StoredObject | None:
        """Remove ``key``; returns its entry, if any."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old.index_values)
            return old

    def replace_entries(
        self, entries: Iterable[StoredObject], *, namespace: str | None = None
    ) -> ReplaceResult:
        """Make the store hold exactly ``entries`` and report the differences.

        With ``namespace``, only that namespace's part is replaced (``entries`` are all in it) and
        the rest kept: one namespace's relist in a cache of several namespaces.
        An entry counts as updated when its resourceVersion changed; keys that disappeared are
        reported with their last known state.
        """
        new_items: dict[str, StoredObject] = {}
        for entry in entries:
            new_items[entry.key] = entry
        result = ReplaceResult()
        with self._lock:
            new_items = {key: self._complete(entry) for key, entry in new_items.items()}
            if namespace is not None:
                prefix = f"{namespace}/"
                kept = {k: e for k, e in self._items.items() if not k.startswith(prefix)}
                outside = [k for k in new_items if not k.startswith(prefix)]
                if outside:
                    raise ValueError(
                        f"replacing namespace {namespace!r} with objects outside it: {outside[:3]}"
                    )
                new_items = {**kept, **new_items}
            new_indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}
            for key, entry in new_items.items():
                for name, vals in entry.index_values:
                    index = new_indices[name]
                    for value in vals:
                        index.setdefault(value, set()).add(key)
            old_items = self._items
            for key, entry in new_items.items():
                old = old_items.get(key)
                if old is None:
                    result.added_entries.append(entry)
                elif old.resource_version != entry.resource_version:
                    result.updated_entries.append((old, entry))
            for key, old in old_items.items():
                if key not in new_items:
                    result.deleted_entries.append(old)
            self._items = new_items
            self._indices = new_indices
        return result

    def list_entries(self) -> builtins.list[StoredObject]:
        with self._lock:
            return list(self._items.values())

    def get_entry(self, key: str) -> StoredObject | None:
        with self._lock:
            return self._items.get(key)

    # --- writes

    def add(self, obj: Obj) -> Obj | None:
        """Insert or replace ``obj``; returns (a decoded copy of) the object it replaced, if any."""
        old = self.put(self.encode(obj))
        return None if old is None else old.decode()

    update = add

    def delete(self, obj: Obj | DeletedFinalStateUnknown) -> Obj | None:
        """Remove the object with ``obj``'s key; returns the removed object, if any."""
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else self._key_func(obj)
        return self.delete_key(key)

    def delete_key(self, key: str) -> Obj | None:
        old = self.remove_key(key)
        return None if old is None else old.decode()

    def replace(self, objs: Iterable[Obj]) -> ReplaceResult:
        """:meth:`replace_entries` for plain objects (every one is encoded before anything changes)."""
        return self.replace_entries([self.encode(obj) for obj in objs])

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions; existing objects are indexed at once. Names must be new."""
        with self._lock:
            clash = set(indexers) & set(self._indexers)
            if clash:
                raise ValueError(f"indexers already exist: {sorted(clash)}")
            built: dict[str, dict[str, set[str]]] = {name: {} for name in indexers}
            items: dict[str, StoredObject] = {}
            for key, entry in self._items.items():
                obj = entry.decode()
                extra = tuple((name, tuple(func(obj))) for name, func in indexers.items())
                for name, vals in extra:
                    for value in vals:
                        built[name].setdefault(value, set()).add(key)
                items[key] = StoredObject(key, entry.resource_version, entry.data, entry.index_values + extra)
            self._indexers.update(indexers)
            self._indices.update(built)
            self._items = items

    # --- reads (each returns freshly decoded objects; decoding happens outside the lock)

    def get(self, obj: Obj) -> Obj | None:
        return self.get_by_key(self._key_func(obj))

    def get_by_key(self, key: str) -> Obj | None:
        entry = self.get_entry(key)
        return None if entry is None else entry.decode()

    def list(self) -> builtins.list[Obj]:
        return [entry.decode() for entry in self.list_entries()]

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
            entries = [self._items[k] for k in sorted(keys)]
        return [entry.decode() for entry in entries]

    def by_index(self, index_name: str, value: str) -> builtins.list[Obj]:
        """Objects whose index function ``index_name`` yields ``value``, ordered by key."""
        with self._lock:
            self._indexer(index_name)
            entries = [self._items[k] for k in sorted(self._indices[index_name].get(value, ()))]
        return [entry.decode() for entry in entries]

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

    def _complete(self, entry: StoredObject) -> StoredObject:
        """``entry`` with values for exactly the current indexers (some may have been added since
        it was encoded, e.g. by another controller asking the shared informer for an index)."""
        names = tuple(name for name, _ in entry.index_values)
        if names == tuple(self._indexers):
            return entry
        have = dict(entry.index_values)
        obj: Obj | None = None
        values: builtins.list[tuple[str, tuple[str, ...]]] = []
        for name, func in self._indexers.items():
            if name in have:
                values.append((name, have[name]))
                continue
            if obj is None:
                obj = entry.decode()
            values.append((name, tuple(func(obj))))
        return StoredObject(entry.key, entry.resource_version, entry.data, tuple(values))

    def _index(self, key: str, values: IndexValues) -> None:
        for name, vals in values:
            index = self._indices[name]
            for value in vals:
                index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, values: IndexValues) -> None:
        for name, vals in values:
            index = self._indices[name]
            for value in vals:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
