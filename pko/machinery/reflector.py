"""One list+watch loop of one scope (all namespaces, or one) feeding a shared informer's cache.

Why apart from :mod:`pko.machinery.informer`: an informer of several namespaces runs one reflector
per namespace (client-go's ``MultiNamespacedCacheBuilder``, controller-runtime's
``cache.Options.DefaultNamespaces``), so RBAC limited to those namespaces suffices and no
cluster-wide list or watch is ever sent. The reflector rules (streaming list, resume, 410 relist,
backoff) are documented in :mod:`pko.machinery.informer`; each reflector keeps its own
resourceVersion, streaming support and backoff, and a relist replaces only its own namespace's part
of the cache.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import aiohttp
import structlog

from pko.machinery.resource import ResourceClient, WatchEvent, api_error_status
from pko.machinery.store import Indexer, Obj, StoredObject, resource_version

__all__ = ["Backoff", "Reflector", "ReflectorSink", "in_namespace"]

_KNOWN_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


class ReflectorSink(Protocol):
    """What a reflector feeds: the informer's cache, handlers and counters."""

    @property
    def indexer(self) -> Indexer: ...

    @property
    def transform(self) -> Callable[[Obj], Obj] | None: ...

    def count(self, what: str) -> None: ...

    def count_event(self, etype: str) -> None: ...

    def replace(
        self, entries: list[StoredObject], list_rv: str, *, streamed: bool, namespace: str | None
    ) -> None: ...

    def apply(self, etype: str, obj: Obj) -> None: ...


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


def in_namespace(client: ResourceClient, namespace: str) -> ResourceClient:
    """``client`` limited to ``namespace``: one reflector's scope of a several-namespace informer."""
    return ResourceClient(
        client.api,
        client.resource,
        namespace,
        request_timeout=client.request_timeout,
        field_manager=client.field_manager,
    )


class Reflector:
    """Lists and watches ``client``'s scope into ``sink``; :meth:`run` until cancelled."""

    def __init__(
        self,
        client: ResourceClient,
        sink: ReflectorSink,
        *,
        label_selector: str | None,
        field_selector: str | None,
        page_size: int,
        min_watch_timeout: int,
        backoff: Backoff,
        streaming_list: bool,
    ) -> None:
        self.client = client
        self._sink = sink
        self.label_selector = label_selector
        self.field_selector = field_selector
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self._backoff = backoff
        # Whether to list by streaming; turned off for good once the server refuses or ignores it.
        self.streaming_list = streaming_list
        self._listed = False  # set by a streaming watch when its initial events are in the cache
        self.synced = False  # the first complete list is in the cache
        self.last_sync_resource_version = ""
        # The list and watch failures (the informer's ``stats.errors``) by HTTP status (None: no
        # answer from the API), so a test can tell a refusal (401/403) from a transient error
        # (429, 5xx: e.g. a fresh apiserver's "storage is (re)initializing").
        self.error_statuses: Counter[int | None] = Counter()
        self._log = structlog.get_logger("pko.informer").bind(
            resource=client.resource.name, namespace=client.namespace or "*"
        )

    async def run(self) -> None:
        """List and watch until cancelled."""
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
                self._sink.count("relists_gone")
                self._log.info(
                    "watch resourceVersion expired (410 Gone); relisting",
                    resource_version=self.last_sync_resource_version,
                )
                need_list, consistent = True, True
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._sink.count("errors")
                status = api_error_status(exc)
                self.error_statuses[status] += 1
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
        """A complete list of this reflector's scope at ``list_rv`` becomes that part of the cache."""
        self.last_sync_resource_version = list_rv
        self.synced = True
        self._sink.replace(entries, list_rv, streamed=streamed, namespace=self.client.namespace)

    def _apply(self, etype: str, obj: Obj) -> None:
        self._sink.apply(etype, obj)
        if etype in _KNOWN_EVENTS:
            self.last_sync_resource_version = resource_version(obj)

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
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                )
            except Exception as exc:
                if token and api_error_status(exc) == 410:
                    self._log.info("list continuation expired; listing unpaged")
                    items, token, limit = [], None, None
                    continue
                raise
            transform, encode = self._sink.transform, self._sink.indexer.encode
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
        self._sink.count("watches")
        stream = self.client.watch(
            resource_version="" if stream_list and consistent else self.last_sync_resource_version,
            timeout_seconds=timeout,
            send_initial_events=stream_list,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
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
                        self._sink.count_event(event.type)
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
        self._sink.count_event(event.type)
        if event.type != "ADDED":
            # A bookmark without the end annotation, or a change, before the list ended: the
            # server ignored sendInitialEvents (what it sent is a plain watch).
            self._streaming_unsupported(f"a {event.type} event before the initial-events-end bookmark")
        transform = self._sink.transform
        obj = transform(event.object) if transform is not None else event.object
        initial.append(self._sink.indexer.encode(obj))

    def _streaming_unsupported(self, why: str) -> None:
        self.streaming_list = False
        self._sink.count("streaming_refusals")
        self._log.info("the server does not serve streaming lists; listing and watching", reason=why)
        raise _StreamingUnsupported(why)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return f"{type(exc).__name__}: {exc}"
    status = api_error_status(exc)
    if status is not None:
        return f"{status} {getattr(exc, 'reason', '')}".strip()
    return repr(exc)
