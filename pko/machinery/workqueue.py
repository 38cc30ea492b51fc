"""The basic work queue, with client-go ``workqueue`` semantics, for asyncio.

Informer handlers ``add`` keys; workers ``await get()``, reconcile, then ``done``. Three sets hold
the state, and every method keeps these invariants:

* ``queue``  -- FIFO of items waiting for a worker. Each item in it is also in ``dirty``, is not
  in ``processing``, and appears once.
* ``dirty``  -- every item that needs processing: the queued ones, plus any item added again while
  a worker holds it.
* ``processing`` -- items handed out by ``get`` and not yet ``done``. An item can be both
  ``processing`` and ``dirty``: ``done`` then moves it to the tail of ``queue``.

What that buys:

* adding an item that is already waiting is a no-op (bursts of events collapse into one reconcile);
* an item is never held by two workers at once;
* an item added while it is being processed is processed again after ``done`` -- nothing is lost;
* fairness: a key sits in ``queue`` at most once and re-enters at the tail, so a key that changes
  constantly cannot starve the others (each waiting key is handed out before the hot key again).

Shutdown: after :meth:`Queue.shutdown` ``add`` ignores new items, ``get`` keeps handing out what
is still queued and raises :class:`ShutDown` once the queue is empty (like Python 3.13's
``asyncio.Queue.shutdown``). :meth:`Queue.shutdown_with_drain` also waits until every queued item
has been handed out and marked ``done``.

Layers, as in client-go (one idea each): this basic queue; :mod:`.delayingqueue` adds
``add_after``; :mod:`.ratelimitingqueue` adds ``add_rate_limited``/``forget``/``num_requeues``.

Not thread-safe, like ``asyncio.Queue``: call it from the event loop thread only. The hot path
takes no locks and, without metrics, does no clock reads.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from pko.machinery.metrics import QueueMetrics, WorkqueueMetricsProvider

__all__ = ["Queue", "ShutDown"]

T = TypeVar("T", bound=Hashable)


class ShutDown(Exception):
    """Raised by ``get`` when the queue is shut down and nothing is left to hand out."""


class Queue(Generic[T]):
    """A de-duplicating FIFO of work items; see the module docstring for the invariants.

    ``name`` labels the metrics (``workqueue_*{name=...}``) and is required with ``metrics``;
    without ``metrics`` nothing is measured and no timestamps are taken.
    """

    def __init__(
        self,
        name: str = "",
        *,
        metrics: WorkqueueMetricsProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if metrics is not None and not name:
            raise ValueError("a queue with metrics needs a name: it is the metrics' label")
        self.name = name
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drainers: list[asyncio.Future[None]] = []
        self._shutting_down = False
        self._clock = clock
        # Only kept when metrics are on: when an item became dirty / was handed out.
        self._added_at: dict[T, float] = {}
        self._started_at: dict[T, float] = {}
        self._metrics: QueueMetrics | None = metrics.queue_metrics(name, self) if metrics else None

    # --- producer side ---------------------------------------------------------------------

    def add(self, item: T) -> None:
        """Mark ``item`` as needing processing. No-op if it is already waiting or we shut down."""
        if self._shutting_down or item in self._dirty:
            return
        m = self._metrics
        if m is not None:
            m.added()
            self._added_at[item] = self._clock()  # not dirty => no add time recorded yet
        self._dirty.add(item)
        if item in self._processing:
            return  # re-queued by done()
        self._queue.append(item)
        self._wake_one_getter()

    # --- consumer side ---------------------------------------------------------------------

    async def get(self) -> T:
        """Wait for an item and take it; the caller must call ``done(item)`` when finished.

        Raises :class:`ShutDown` once the queue is shut down and empty.
        """
        if not self._queue:
            await self._wait_for_item()
        item = self._queue.popleft()
        self._processing.add(item)
        self._dirty.discard(item)
        m = self._metrics
        if m is not None:
            now = self._clock()
            added = self._added_at.pop(item, None)
            if added is not None:
                m.observe_queue_latency(now - added)
            self._started_at[item] = now
        return item

    def done(self, item: T) -> None:
        """Finish processing ``item``; if it was added meanwhile, it goes back to the queue's tail.

        Raises ``ValueError`` if ``item`` is not being processed (a worker bug: it would break
        the invariants).
        """
        try:
            self._processing.remove(item)
        except KeyError:
            raise ValueError(f"done({item!r}) for an item that is not being processed") from None
        m = self._metrics
        if m is not None:
            started = self._started_at.pop(item, None)
            if started is not None:
                m.observe_work_duration(self._clock() - started)
        if item in self._dirty:
            self._queue.append(item)
            self._wake_one_getter()
        elif not self._processing and not self._queue and self._drainers:
            self._wake_drainers()

    def __len__(self) -> int:
        """Items waiting for a worker (not counting those being processed)."""
        return len(self._queue)

    def processing_ages(self) -> list[float]:
        """Seconds each in-flight item has been processing (for metrics; empty without metrics)."""
        started = list(self._started_at.values())  # one C-level snapshot: safe from a scrape thread
        now = self._clock()
        return [now - t for t in started]

    @property
    def processing(self) -> int:
        """How many items workers currently hold."""
        return len(self._processing)

    # --- shutdown ----------------------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def shutdown(self) -> None:
        """Refuse new items; blocked ``get`` calls take what is queued, then raise ShutDown."""
        self._shutting_down = True
        getters, self._getters = self._getters, deque()
        for getter in getters:
            if not getter.done():
                getter.set_result(None)
        if not self._processing and not self._queue:
            self._wake_drainers()

    async def shutdown_with_drain(self) -> None:
        """Shut down, then wait until everything queued has been processed and ``done``.

        Waits forever if nobody consumes the queue: wrap it in ``asyncio.timeout`` if that can happen.
        """
        self.shutdown()
        while self._processing or self._queue:
            drained = asyncio.get_running_loop().create_future()
            self._drainers.append(drained)
            await drained

    # --- internals ---------------------------------------------------------------------------

    async def _wait_for_item(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._queue:
            if self._shutting_down:
                raise ShutDown
            getter: asyncio.Future[None] = loop.create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                getter.cancel()  # no-op if a wake-up already arrived
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if not getter.cancelled() and self._queue:
                    # We were woken for an item we will not take: pass the wake-up on.
                    self._wake_one_getter()
                raise

    def _wake_one_getter(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, []
        for drained in drainers:
            if not drained.done():
                drained.set_result(None)
