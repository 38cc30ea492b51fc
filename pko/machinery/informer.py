"""Shared informer: a reflector (list, then watch) feeding an indexed cache and event handlers.

Shape and semantics follow client-go's ``tools/cache`` (Reflector + Indexer + SharedInformer),
without a DeltaFIFO: handlers are synchronous and only enqueue keys, so the reflector applies
each change to the store and notifies handlers in the same step, on the event loop.

Reflector rules (why each one exists):
- The first list is a consistent read (``resourceVersion`` unset), so a cold start never sees data
  older than etcd. It is a *streaming list* when the server offers one (the WatchList feature:
  on by default in 1.32 and since 1.34): one watch with ``sendInitialEvents=true``,
  ``resourceVersionMatch=NotOlderThan`` and bookmarks, whose ADDED events are the list and whose
  BOOKMARK annotated ``k8s.io/initial-events-end`` ends it; the same stream then goes on as the
  watch. Nothing reaches the cache or the handlers before that bookmark: the collected state
  replaces the cache at once, exactly as a list would. A server without the feature answers 422
  (1.19 to 1.31 and 1.33 by default: ``resourceVersionMatch``/``sendInitialEvents is forbidden``)
  or 400; one that ignores the parameters (older than 1.19) sends a bookmark without the
  annotation, or changes, or ends the stream without it: then the informer lists and watches
  instead, from then on. Otherwise the list is a paged LIST, so it never holds more than one page
  of raw JSON at a time.
- The watch starts from the list's resourceVersion with bookmarks on, so reconnects resume from a
  recent version even when nothing in the selection changed (the watch cache sends a bookmark
  about every minute and 2 s before the watch's ``timeoutSeconds``; a server without the watch
  cache sends none).
- A watch the server ends (its ``timeoutSeconds``) or a broken connection is resumed from the last
  resourceVersion seen: the apiserver replays what was missed. Only when it answers
  ``410 Gone`` (the version was compacted) do we relist; the relist is then diffed against the
  cache, and objects that vanished meanwhile are reported as ``DeletedFinalStateUnknown``.
- After other errors (403, 404, 5xx) we back off (exponential, jittered, capped) and relist with
  ``resourceVersionMatch=NotOlderThan`` so the cache never goes back in time.

Invariants: ``has_synced()`` turns true once the first list (LIST or streamed) is in the store and
every handler has seen it; a handler added later first receives an ``on_add`` for every cached object; the
cache holds transformed objects only (by default without managedFields and last-applied
annotations), encoded (see :mod:`pko.machinery.store`). Each list page (or streamed object) is
transformed and encoded as it arrives, so a cold sync never holds more than one page of decoded
objects; an update's
``old`` object is decoded from the cache only when there are handlers to receive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import Counter as TallyCounter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter

from pko.machinery.recentwrites import RecentWrites
from pko.machinery.reflector import Backoff, Reflector, in_namespace
from pko.machinery.resource import Resource, ResourceClient
from pko.machinery.store import (
    LAST_APPLIED_ANNOTATION,
    NAMESPACE_INDEX,
    DeletedFinalStateUnknown,
    Indexer,
    IndexFunc,
    Obj,
    StoredObject,
    index_by_namespace,
    strip_managed_fields,
)

Transform = Callable[[Obj], Obj]

__all__ = [
    "LAST_APPLIED_ANNOTATION",
    "Backoff",
    "EventHandler",
    "FuncHandler",
    "SharedInformer",
    "Transform",
    "strip_managed_fields",
]

# ----- handlers ----------------------------------------------------------------------------------


class EventHandler(Protocol):
    """Called on the event loop, in cache order. Must not block: enqueue keys, do no work."""

    def on_add(self, obj: Obj) -> None: ...

    def on_update(self, old: Obj, new: Obj) -> None: ...

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None: ...


@dataclass(frozen=True, slots=True)
class FuncHandler:
    """An :class:`EventHandler` from optional functions."""

    add: Callable[[Obj], None] | None = None
    update: Callable[[Obj, Obj], None] | None = None
    delete: Callable[[Obj | DeletedFinalStateUnknown], None] | None = None

    def on_add(self, obj: Obj) -> None:
        if self.add:
            self.add(obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if self.update:
            self.update(old, new)

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        if self.delete:
            self.delete(obj)


# ----- statistics and metrics --------------------------------------------------------------------


@dataclass(slots=True)
class ReflectorStats:
    """Plain counters, always kept (metrics are optional); tests assert on them."""

    lists: int = 0  # complete lists in the cache, LIST or streamed
    streamed_lists: int = 0  # of which streamed (sendInitialEvents)
    streaming_refusals: int = 0  # the server refused or ignored a streaming list (then: LIST)
    watches: int = 0
    relists_gone: int = 0
    errors: int = 0
    events: TallyCounter[str] = field(default_factory=TallyCounter)


class ReflectorMetrics:
    """Prometheus counters shared by every reflector that reports to one registry."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, ReflectorMetrics] = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["resource"]
        self.lists = Counter(
            "pko_reflector_lists", "Complete lists (LIST or streamed).", labels, registry=registry
        )
        self.streamed_lists = Counter(
            "pko_reflector_streamed_lists",
            "Complete lists received as a watch stream (sendInitialEvents).",
            labels,
            registry=registry,
        )
        self.streaming_refusals = Counter(
            "pko_reflector_streaming_refusals",
            "Streaming lists the server refused or ignored (the reflector then lists and watches).",
            labels,
            registry=registry,
        )
        self.watches = Counter("pko_reflector_watches", "Watch requests started.", labels, registry=registry)
        self.relists_gone = Counter(
            "pko_reflector_relists_gone",
            "Relists because the watched resourceVersion was compacted (410 Gone).",
            labels,
            registry=registry,
        )
        self.errors = Counter("pko_reflector_errors", "List or watch failures.", labels, registry=registry)
        self.events = Counter(
            "pko_reflector_watch_events", "Watch events received.", [*labels, "type"], registry=registry
        )

    @classmethod
    def for_registry(cls, registry: CollectorRegistry) -> ReflectorMetrics:
        with cls._lock:
            metrics = cls._by_registry.get(registry)
            if metrics is None:
                metrics = cls._by_registry[registry] = cls(registry)
            return metrics


# ----- the informer ------------------------------------------------------------------------------


class SharedInformer:
    """One list+watch of a resource type, one cache, many handlers.

    Use one per resource type (see :mod:`pko.machinery.informerfactory`). ``start()`` needs a
    running event loop; ``stop()`` cancels the reflector and closes its watch connection.

    ``namespaces``: list and watch each of these namespaces apart (one reflector, one watch
    connection each) into the one cache, instead of ``client``'s scope; ``client`` (best
    cluster-wide) stays the client writers use. Synced once every namespace has been listed.
    """

    def __init__(
        self,
        client: ResourceClient,
        *,
        indexers: Mapping[str, IndexFunc] | None = None,
        resync_period: float = 0.0,
        transform: Transform | None = strip_managed_fields,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        min_watch_timeout: int = 300,
        backoff_initial: float = 0.8,
        backoff_max: float = 30.0,
        metrics_registry: CollectorRegistry | None = None,
        streaming_list: bool = True,
        namespaces: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.resource: Resource = client.resource
        all_indexers: dict[str, IndexFunc] = {}
        if client.resource.namespaced:
            all_indexers[NAMESPACE_INDEX] = index_by_namespace
        all_indexers.update(indexers or {})
        self.indexer = Indexer(indexers=all_indexers)
        self.resync_period = resync_period
        self._transform = transform
        # Read-your-writes: what controllers wrote through this informer's type, until watched back.
        self.writes = RecentWrites(transform)
        scopes = [in_namespace(client, ns) for ns in dict.fromkeys(namespaces)] if namespaces else [client]
        self.reflectors = [
            Reflector(
                scope,
                self,
                label_selector=label_selector,
                field_selector=field_selector,
                page_size=page_size,
                min_watch_timeout=min_watch_timeout,
                backoff=Backoff(backoff_initial, backoff_max),
                streaming_list=streaming_list,
            )
            for scope in scopes
        ]
        self._metrics = ReflectorMetrics.for_registry(metrics_registry) if metrics_registry else None
        self._event_counters: dict[str, Counter] = {}  # watch event type -> its labelled counter
        self.stats = ReflectorStats()
        self._handlers: list[EventHandler] = []
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self._log = structlog.get_logger("pko.informer").bind(
            resource=self.resource.name,
            namespace=",".join(r.client.namespace or "*" for r in self.reflectors),
        )

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion the (first) reflector resumes from."""
        return self.reflectors[0].last_sync_resource_version

    @property
    def streaming_list(self) -> bool:
        """Whether every reflector still lists by streaming."""
        return all(r.streaming_list for r in self.reflectors)

    @property
    def transform(self) -> Transform | None:
        return self._transform

    # --- reads through the cache

    def wrote(self, obj: Obj) -> Obj:
        """Record a write's response so :meth:`latest` returns it until the watch delivers it
        (the operator's one stale-read guard); returns ``obj``."""
        return self.writes.wrote(obj)

    def latest(self, key: str) -> Obj | None:
        """The cached object, or this process's own later write of it the cache has not caught up with."""
        return self.writes.latest(key, self.indexer.get_by_key(key))

    # --- lifecycle

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        """Start listing and watching (idempotent). An informer cannot be restarted after stop."""
        if self._stopped:
            raise RuntimeError(f"informer for {self.resource.name} was stopped")
        if self._tasks:
            return
        for reflector in self.reflectors:
            where = reflector.client.namespace or "*"
            self._tasks.append(
                asyncio.create_task(reflector.run(), name=f"reflector:{self.resource.name}:{where}")
            )
        if self.resync_period > 0:
            self._tasks.append(asyncio.create_task(self._resync(), name=f"resync:{self.resource.name}"))

    async def stop(self) -> None:
        """Stop and wait until the watch connection is closed."""
        self._stopped = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - a bool, not an error
        """True once synced; False if ``timeout`` seconds pass first."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    # --- handlers and indexes

    def add_event_handler(self, handler: EventHandler) -> EventHandler:
        """Register ``handler``; it first gets ``on_add`` for everything already cached.

        Call on the event loop's thread (handlers are invoked there).
        """
        self._handlers.append(handler)
        for entry in self.indexer.list_entries():  # decoded one at a time
            self._call(handler, "on_add", entry.decode())
        return handler

    def remove_event_handler(self, handler: EventHandler) -> None:
        self._handlers.remove(handler)

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        self.indexer.add_indexers(indexers)

    # --- notification

    def _call(self, handler: EventHandler, method: str, *args: Any) -> None:
        try:
            getattr(handler, method)(*args)
        except Exception:
            self._log.exception("event handler failed", handler=repr(handler), method=method)

    def _notify_add(self, obj: Obj) -> None:
        for handler in list(self._handlers):
            self._call(handler, "on_add", obj)

    def _notify_update(self, old: Obj, new: Obj) -> None:
        for handler in list(self._handlers):
            self._call(handler, "on_update", old, new)

    def _notify_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        for handler in list(self._handlers):
            self._call(handler, "on_delete", obj)

    # --- what the reflectors feed (ReflectorSink)

    def count(self, what: str) -> None:
        setattr(self.stats, what, getattr(self.stats, what) + 1)
        if self._metrics is not None:
            getattr(self._metrics, what).labels(self.resource.name).inc()

    def count_event(self, etype: str) -> None:
        self.stats.events[etype] += 1
        if self._metrics is not None:
            counter = self._event_counters.get(etype)
            if counter is None:  # looked up once per type: ``labels`` costs more than the count
                counter = self._event_counters[etype] = self._metrics.events.labels(self.resource.name, etype)
            counter.inc()

    def replace(
        self, entries: list[StoredObject], list_rv: str, *, streamed: bool, namespace: str | None
    ) -> None:
        """Make ``entries`` (a complete list at ``list_rv`` of ``namespace``, or of everything) that
        part of the cache; tell handlers what changed. Synced once every reflector has listed."""
        self.count("lists")
        if streamed:
            self.count("streamed_lists")
        result = self.indexer.replace_entries(entries, namespace=namespace)
        entries.clear()
        added, updated, deleted = result.added_entries, result.updated_entries, result.deleted_entries
        if self._handlers:  # decode one object at a time, and only for handlers
            for entry in added:
                self._notify_add(entry.decode())
            for old, new in updated:
                self._notify_update(old.decode(), new.decode())
            for gone in deleted:
                self._notify_delete(DeletedFinalStateUnknown(gone.key, gone.decode()))
        log = self._log.bind(namespace=namespace or "*") if len(self.reflectors) > 1 else self._log
        if not self._synced.is_set() and all(r.synced for r in self.reflectors):
            self._synced.set()
            log.info(
                "synced",
                objects=len(self.indexer),
                resource_version=list_rv,
                by="streaming list" if streamed else "list",
            )
        elif added or updated or deleted:
            log.info("relist applied", added=len(added), updated=len(updated), deleted=len(deleted))

    def apply(self, etype: str, obj: Obj) -> None:
        """One watch event: the cache and the handlers (a bookmark only counts)."""
        self.count_event(etype)
        if etype == "BOOKMARK":
            return
        if self._transform is not None:
            obj = self._transform(obj)
        if self.writes:
            self.writes.caught_up(obj, gone=etype == "DELETED")
        if etype in ("ADDED", "MODIFIED"):
            old = self.indexer.put(self.indexer.encode(obj))
            if old is None:
                self._notify_add(obj)
            elif self._handlers:
                self._notify_update(old.decode(), obj)
        elif etype == "DELETED":
            self.indexer.remove_key(self.indexer.key(obj))
            self._notify_delete(obj)
        else:
            self._log.warning("unknown watch event type", type=etype)

    async def _resync(self) -> None:
        """Every ``resync_period``, re-deliver every cached object as an update (old is new)."""
        await self._synced.wait()
        while True:
            await asyncio.sleep(self.resync_period)
            for entry in self.indexer.list_entries():
                obj = entry.decode()  # one copy serves as both old and new, as in client-go
                self._notify_update(obj, obj)
