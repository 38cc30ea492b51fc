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
import random
import threading
import weakref
from collections import Counter as TallyCounter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import structlog
from prometheus_client import CollectorRegistry, Counter

from pko.machinery.recentwrites import RecentWrites
from pko.machinery.resource import Resource, ResourceClient, WatchEvent, api_error_status
from pko.machinery.store import (
    LAST_APPLIED_ANNOTATION,
    NAMESPACE_INDEX,
    DeletedFinalStateUnknown,
    Indexer,
    IndexFunc,
    Obj,
    StoredObject,
    index_by_namespace,
    resource_version,
    strip_managed_fields,
)

Transform = Callable[[Obj], Obj]

__all__ = [
    "LAST_APPLIED_ANNOTATION",
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


# ----- backoff -----------------------------------------------------------------------------------


class Backoff:
    """Exponential backoff with jitter: ``initial * 2**n`` capped at ``maximum``, each +-``jitter``."""

    def __init__(self, initial: float, maximum: float, jitter: float = 0.2) -> None:
        self.initial, self.maximum, self.jitter = initial, maximum, jitter
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def reset(self) -> None:
        self._next = self.initial


class _RelistNeeded(Exception):
    """Raised inside the reflector when the watch cannot resume (410 Gone)."""


class _StreamingUnsupported(Exception):
    """Raised inside the reflector when the server refused or ignored a streaming list."""


# ----- the informer ------------------------------------------------------------------------------


class SharedInformer:
    """One list+watch of a resource type, one cache, many handlers.

    Use one per resource type (see :mod:`pko.machinery.informerfactory`). ``start()`` needs a
    running event loop; ``stop()`` cancels the reflector and closes its watch connection.
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
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        # Whether to list by streaming; turned off for good once the server refuses or ignores it.
        self.streaming_list = streaming_list
        self._listed = False  # set by a streaming watch when its initial events are in the cache
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._metrics = ReflectorMetrics.for_registry(metrics_registry) if metrics_registry else None
        self.stats = ReflectorStats()
        self._handlers: list[EventHandler] = []
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self.last_sync_resource_version = ""
        self._log = structlog.get_logger("pko.informer").bind(
            resource=self.resource.name, namespace=client.namespace or "*"
        )

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
        self._tasks.append(asyncio.create_task(self._reflect(), name=f"reflector:{self.resource.name}"))
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

    # --- reflector

    def _count(self, what: str) -> None:
        setattr(self.stats, what, getattr(self.stats, what) + 1)
        if self._metrics is not None:
            getattr(self._metrics, what).labels(self.resource.name).inc()

    async def _reflect(self) -> None:
        need_list = True
        consistent = True  # the next list must be a consistent read (first list, or after 410)
        while True:
            try:
                if need_list and self.streaming_list:
                    self._listed = False
                    try:
                        went_on = await self._watch(stream_list=True, consistent=consistent)
                    finally:
                        if self._listed:  # the list is in: whatever ended the stream, watch from it
                            need_list, consistent = False, False
                elif need_list:
                    await self._list_and_replace(consistent)
                    need_list, consistent = False, False
                    went_on = await self._watch()
                else:
                    went_on = await self._watch()
                if not went_on:
                    # The server ended a watch at once without news: do not spin.
                    await asyncio.sleep(self._backoff.next())
            except _StreamingUnsupported:
                continue  # list at once, then watch
            except _RelistNeeded:
                self._count("relists_gone")
                self._log.info(
                    "watch resourceVersion expired (410 Gone); relisting",
                    resource_version=self.last_sync_resource_version,
                )
                need_list, consistent = True, True
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._count("errors")
                status = api_error_status(exc)
                if need_list:
                    consistent = True  # e.g. "too large resource version" after an apiserver restart
                elif status is not None and status != 429 and status < 500:
                    need_list = True  # 403/404/...: the watch cannot be trusted; resume from a relist
                delay = self._backoff.next()
                self._log.warning(
                    "list failed" if need_list else "watch failed",
                    error=_describe(exc),
                    status=status,
                    retry_in=round(delay, 2),
                )
                await asyncio.sleep(delay)

    async def _list_and_replace(self, consistent: bool) -> None:
        entries, list_rv = await self._list_all(consistent)
        self._replace(entries, list_rv, streamed=False)

    def _replace(self, entries: list[StoredObject], list_rv: str, *, streamed: bool) -> None:
        """Make ``entries`` (a complete list at ``list_rv``) the cache; tell handlers what changed."""
        self._count("lists")
        if streamed:
            self._count("streamed_lists")
        result = self.indexer.replace_entries(entries)
        entries.clear()
        self.last_sync_resource_version = list_rv
        added, updated, deleted = result.added_entries, result.updated_entries, result.deleted_entries
        if self._handlers:  # decode one object at a time, and only for handlers
            for entry in added:
                self._notify_add(entry.decode())
            for old, new in updated:
                self._notify_update(old.decode(), new.decode())
            for gone in deleted:
                self._notify_delete(DeletedFinalStateUnknown(gone.key, gone.decode()))
        if not self._synced.is_set():
            self._synced.set()
            self._log.info(
                "synced",
                objects=len(self.indexer),
                resource_version=list_rv,
                by="streaming list" if streamed else "list",
            )
        elif added or updated or deleted:
            self._log.info("relist applied", added=len(added), updated=len(updated), deleted=len(deleted))

    async def _list_all(self, consistent: bool) -> tuple[list[StoredObject], str]:
        """Every page of one list, transformed and encoded page by page, and the list's
        resourceVersion. If a continue token expires mid-way, start over unpaged."""
        rv, match = (None, None) if consistent else (self.last_sync_resource_version, "NotOlderThan")
        items: list[StoredObject] = []
        token: str | None = None
        limit: int | None = self._page_size
        while True:
            try:
                page = await self.client.list(
                    limit=limit,
                    continue_token=token,
                    resource_version=None if token else rv,
                    resource_version_match=None if token else match,
                    label_selector=self._label_selector,
                    field_selector=self._field_selector,
                )
            except Exception as exc:
                if token and api_error_status(exc) == 410:
                    self._log.info("list continuation expired; listing unpaged")
                    items, token, limit = [], None, None
                    continue
                raise
            transform, encode = self._transform, self.indexer.encode
            if transform is not None:
                items.extend(encode(transform(obj)) for obj in page.items)
            else:
                items.extend(encode(obj) for obj in page.items)
            if not page.continue_token:
                return items, page.resource_version
            token = page.continue_token
            del page

    async def _watch(self, *, stream_list: bool = False, consistent: bool = False) -> bool:
        """Watch until the server ends the stream; False if it ended at once with no events.

        ``stream_list``: start with a streaming list (a consistent read when ``consistent``, else
        not older than the last resourceVersion) and replace the cache with it when its
        initial-events-end bookmark arrives (then ``self._listed`` is set).
        """
        timeout = random.randint(self._min_watch_timeout, 2 * self._min_watch_timeout)
        loop = asyncio.get_running_loop()
        started, received = loop.time(), 0
        self._count("watches")
        stream = self.client.watch(
            resource_version="" if stream_list and consistent else self.last_sync_resource_version,
            timeout_seconds=timeout,
            send_initial_events=stream_list,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
        )
        initial: list[StoredObject] | None = [] if stream_list else None  # None: past the list
        try:
            async with stream as events:
                async for event in events:
                    received += 1
                    self._backoff.reset()
                    if initial is None:
                        self._apply(event.type, event.object)
                    elif event.ends_initial_events:
                        self._count_event(event.type)
                        self._replace(initial, resource_version(event.object), streamed=True)
                        self._listed, initial = True, None
                    else:
                        self._collect(initial, event)
        except (_StreamingUnsupported, asyncio.CancelledError):
            raise
        except Exception as exc:
            status = api_error_status(exc)
            if status == 410:
                raise _RelistNeeded() from exc
            if initial is not None and received == 0 and status in (400, 422):
                self._streaming_unsupported(f"refused: {_describe(exc)}")
            raise
        if initial is not None:
            self._streaming_unsupported("the stream ended before its initial-events-end bookmark")
        return received > 0 or loop.time() - started >= 1.0

    def _collect(self, initial: list[StoredObject], event: WatchEvent) -> None:
        """One initial event of a streaming list: kept aside until the list is complete."""
        self._count_event(event.type)
        if event.type != "ADDED":
            # A bookmark without the end annotation, or a change, before the list ended: the
            # server ignored sendInitialEvents (what it sent is a plain watch).
            self._streaming_unsupported(f"a {event.type} event before the initial-events-end bookmark")
        obj = self._transform(event.object) if self._transform is not None else event.object
        initial.append(self.indexer.encode(obj))

    def _streaming_unsupported(self, why: str) -> None:
        self.streaming_list = False
        self._count("streaming_refusals")
        self._log.info("the server does not serve streaming lists; listing and watching", reason=why)
        raise _StreamingUnsupported(why)

    def _count_event(self, etype: str) -> None:
        self.stats.events[etype] += 1
        if self._metrics is not None:
            self._metrics.events.labels(self.resource.name, etype).inc()

    def _apply(self, etype: str, obj: Obj) -> None:
        self._count_event(etype)
        if etype == "BOOKMARK":
            self.last_sync_resource_version = resource_version(obj)
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
            return
        self.last_sync_resource_version = resource_version(obj)

    async def _resync(self) -> None:
        """Every ``resync_period``, re-deliver every cached object as an update (old is new)."""
        await self._synced.wait()
        while True:
            await asyncio.sleep(self.resync_period)
            for entry in self.indexer.list_entries():
                obj = entry.decode()  # one copy serves as both old and new, as in client-go
                self._notify_update(obj, obj)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return f"{type(exc).__name__}: {exc}"
    status = api_error_status(exc)
    if status is not None:
        return f"{status} {getattr(exc, 'reason', '')}".strip()
    return repr(exc)
