"""Kubernetes Events (``core/v1``), recorded the way client-go's ``record`` package does.

Why the ceremony: an Event is an API object, and a controller in a hot loop would otherwise
write thousands of them. client-go keeps three defences, and so do we:

* **Identical events are counted, not repeated.** The first occurrence of an (involved object,
  type, reason, message, source) creates an Event named ``<object name>.<hex nanoseconds>``;
  repeats patch its ``count``, ``lastTimestamp`` and ``message`` (an Event expired by the
  apiserver's TTL is created again).
* **Similar events are combined.** When an object gets more than 10 different messages for one
  (type, reason) within 10 minutes, further ones go to a single Event whose message is
  ``(combined from similar events): <latest message>``.
* **Spam is dropped.** A token bucket per involved object (burst 25, one more every 5 minutes)
  drops what exceeds it; dropped events are counted in ``pko_events_dropped_total``.

:meth:`EventRecorder.event` never blocks and never raises: it timestamps the event and queues
it (at most 1000 waiting, beyond that they are dropped, as client-go's broadcaster does); one
background task correlates and sends them. An apiserver error on a write is retried a few times
for server or network errors and given up for client errors (a namespace being deleted refuses
Events with 403/404: nothing to fix by retrying).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter

from pko import defaults
from pko.machinery.kubeclient import KubeClient
from pko.machinery.resource import EVENTS, Obj, ResourceClient, api_error_status

__all__ = ["Emit", "EventRecorder", "EventType", "FakeRecorder", "Listener", "Log", "Recorder"]

EventType = Literal["Normal", "Warning"]

SPAM_BURST: Final = 25
SPAM_REFILL_PER_SECOND: Final = 1.0 / 300.0
MAX_SIMILAR_MESSAGES: Final = 10  # client-go's defaultAggregateMaxEvents
SIMILAR_WINDOW_SECONDS: Final = 600.0  # client-go's defaultAggregateIntervalInSeconds
CACHE_SIZE: Final = 4096  # client-go's maxLruCacheEntries
MAX_QUEUED: Final = 1000  # client-go's maxQueuedEvents
COMBINED_PREFIX: Final = "(combined from similar events): "
_SEND_ATTEMPTS: Final = 4


@dataclass(frozen=True, slots=True)
class Emit:
    """An Event a reconcile decided on: one of its planned writes, carried out by
    :meth:`Recorder.event` on the reconciled object."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Log:
    """An info line a reconcile decided on, written to the reconciler's log (a planned write, like
    :class:`Emit`)."""

    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)


# Told of every event as it is recorded (before correlation), e.g. to forward it elsewhere; must not block.
Listener = Callable[[Obj, EventType, str, str], None]


class Recorder(Protocol):
    """What a reconciler needs: fire-and-forget events about an object."""

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None: ...


@dataclass(slots=True)
class _Pending:
    ref: Obj  # the involvedObject reference
    type: str
    reason: str
    message: str
    at: datetime


@dataclass(slots=True)
class _Similar:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass(slots=True)
class _Sent:
    name: str
    namespace: str
    count: int
    first_timestamp: str


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A size-bounded mapping that forgets the least recently used entry."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self._size:
            self._data.popitem(last=False)


def object_reference(obj: Obj) -> Obj:
    """The ``involvedObject`` of an event about ``obj`` (client-go's ``GetReference``)."""
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion", ""),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "uid": meta.get("uid", ""),
        "resourceVersion": meta.get("resourceVersion", ""),
    }
    return {k: v for k, v in ref.items() if v}


def _time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records Events as ``component`` (``source.component`` and ``reportingComponent``).

    ``host`` is ``source.host``/``reportingInstance`` (client-go leaves it empty for controllers).
    ``request_timeout`` bounds each write (the manager passes its ``kube_api_timeout``).
    Call :meth:`start` on the event loop and ``await stop()`` at shutdown; events recorded before
    ``start()`` wait in the queue.
    """

    def __init__(
        self,
        api: KubeClient,
        component: str,
        *,
        host: str | None = None,
        registry: CollectorRegistry | None = None,
        burst: int = SPAM_BURST,
        refill_per_second: float = SPAM_REFILL_PER_SECOND,
        retry_interval: float = 1.0,
        request_timeout: float = defaults.KUBE_API_TIMEOUT,
    ) -> None:
        self.component = component
        self.host = host or ""
        self._client = ResourceClient(api, EVENTS, request_timeout=request_timeout)
        self._burst = burst
        self._refill = refill_per_second
        self._retry_interval = retry_interval
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(MAX_QUEUED)
        self._similar: _LRU[tuple[str, ...], _Similar] = _LRU(CACHE_SIZE)
        self._sent: _LRU[tuple[str, ...], _Sent] = _LRU(CACHE_SIZE)
        self._buckets: _LRU[tuple[str, ...], _Bucket] = _LRU(CACHE_SIZE)
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._log = structlog.get_logger("pko.events")
        self._listeners: list[Listener] = []
        self._dropped = Counter(
            "pko_events_dropped",
            "Kubernetes Events not written, by why: spam (the per-object rate limit), queue_full, error.",
            ["reason"],
            registry=registry,
        )

    # --- recording ------------------------------------------------------------------------------

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        """Queue an event about ``obj`` (an object read from the API: it needs name and uid)."""
        if self._stopped:
            return
        for listener in self._listeners:
            try:
                listener(obj, type_, reason, message)
            except Exception as exc:  # a listener's bug must not break recording
                self._log.error("an event listener failed", reason=reason, exc_info=exc)
        try:
            self._queue.put_nowait(_Pending(object_reference(obj), type_, reason, message, datetime.now(UTC)))
        except asyncio.QueueFull:
            self._dropped.labels("queue_full").inc()

    def add_listener(self, listener: Listener) -> None:
        """Tell ``listener`` of every event recorded from now on (called in :meth:`event`)."""
        self._listeners.append(listener)

    def eventf(self, obj: Obj, type_: EventType, reason: str, fmt: str, *args: Any) -> None:
        """:meth:`event` with a ``%``-format message (client-go's ``Eventf``)."""
        self.event(obj, type_, reason, fmt % args if args else fmt)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._run(), name=f"events:{self.component}")

    async def stop(self, drain_timeout: float = 2.0) -> None:
        """Stop recording; give queued events up to ``drain_timeout`` s to be written."""
        self._stopped = True
        task, self._task = self._task, None
        if task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), drain_timeout)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            pending = await self._queue.get()
            try:
                await self._record(pending)
            except Exception as exc:  # a bug here must not end event recording
                self._log.error("recording an event failed", reason=pending.reason, exc_info=exc)
            finally:
                self._queue.task_done()

    # --- correlation (client-go's EventCorrelator) ----------------------------------------------

    def _source_key(self, ref: Obj) -> tuple[str, ...]:
        return (
            self.component,
            self.host,
            ref.get("kind", ""),
            ref.get("namespace", ""),
            ref.get("name", ""),
            ref.get("uid", ""),
            ref.get("apiVersion", ""),
        )

    def _aggregate(self, p: _Pending, now: float) -> tuple[tuple[str, ...], str]:
        """The identity of the Event to write and its message, after combining similar events."""
        similar_key = (*self._source_key(p.ref), p.type, p.reason)
        record = self._similar.get(similar_key)
        if record is None or now - record.last > SIMILAR_WINDOW_SECONDS:
            record = _Similar()
            self._similar.put(similar_key, record)
        record.messages.add(p.message)
        record.last = now
        if len(record.messages) <= MAX_SIMILAR_MESSAGES:
            return (*similar_key, p.message), p.message
        return similar_key, COMBINED_PREFIX + p.message

    def _allow(self, p: _Pending, now: float) -> bool:
        """The per-object token bucket."""
        key = self._source_key(p.ref)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self._burst), now)
            self._buckets.put(key, bucket)
        bucket.tokens = min(float(self._burst), bucket.tokens + (now - bucket.stamp) * self._refill)
        bucket.stamp = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    async def _record(self, p: _Pending) -> None:
        now = time.monotonic()
        key, message = self._aggregate(p, now)
        if not self._allow(p, now):
            self._dropped.labels("spam").inc()
            self._log.debug("event dropped by the rate limit", reason=p.reason, object=p.ref.get("name"))
            return
        stamp = _time(p.at)
        sent = self._sent.get(key)
        if sent is not None:
            sent.count += 1
            patch = {"count": sent.count, "lastTimestamp": stamp, "message": message}
            name, namespace = sent.name, sent.namespace
            if await self._send(p, lambda: self._client.patch(name, patch, namespace=namespace)):
                return
            # The Event expired (or was deleted): write it again under its name, with its count.
        else:
            namespace = p.ref.get("namespace") or "default"
            sent = _Sent(f"{p.ref.get('name', '')}.{time.time_ns():x}", namespace, 1, stamp)
            self._sent.put(key, sent)
        body = self._body(p, sent, message, stamp)
        await self._send(p, lambda: self._client.create(body, namespace=body["metadata"]["namespace"]))

    def _body(self, p: _Pending, sent: _Sent, message: str, stamp: str) -> Obj:
        source = {"component": self.component}
        if self.host:
            source["host"] = self.host
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": sent.name, "namespace": sent.namespace},
            "involvedObject": p.ref,
            "type": p.type,
            "reason": p.reason,
            "message": message,
            "source": source,
            "firstTimestamp": sent.first_timestamp,
            "lastTimestamp": stamp,
            "count": sent.count,
            "reportingComponent": self.component,
            "reportingInstance": self.host,
        }
        return body

    async def _send(self, p: _Pending, write: Callable[[], Awaitable[Obj]]) -> bool:
        """Run ``write`` with retries; True if written, False if the Event was not found (404)."""
        delay = self._retry_interval
        for attempt in range(1, _SEND_ATTEMPTS + 1):
            try:
                await write()
                return True
            except Exception as exc:
                status = api_error_status(exc)
                if status == 404:
                    return False
                retry = status is None or status >= 500 or status == 429
                if not retry or attempt == _SEND_ATTEMPTS:
                    self._dropped.labels("error").inc()
                    self._log.warning(
                        "could not write an event",
                        reason=p.reason,
                        object=p.ref.get("name"),
                        status=status,
                        error=str(getattr(exc, "reason", exc)),
                    )
                    return True
            await asyncio.sleep(delay)
            delay *= 2
        return True


class FakeRecorder:
    """An in-memory :class:`Recorder` for unit tests: ``events`` holds ``"<type> <reason> <message>"``
    strings, as client-go's ``FakeRecorder`` does."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.objects: list[Obj] = []

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        self.events.append(f"{type_} {reason} {message}")
        self.objects.append(obj)
