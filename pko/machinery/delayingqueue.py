"""A work queue that can also add an item later (client-go's delaying queue).

``add_after(item, seconds)`` arms one event-loop timer per waiting item. Invariants:

* an item has at most one pending timer; asking again keeps the *earlier* ready time, so a
  requeue-after can be brought forward but never pushed back by a later, longer request;
* when the timer fires the item goes through the ordinary ``add`` (so it is de-duplicated
  against the queue and re-queued after ``done`` if a worker holds it);
* ``shutdown`` cancels every pending timer: items still waiting are dropped, as in client-go.

A plain ``add`` does not cancel a pending timer: the item is processed now and again when the
timer fires (a level-triggered reconciler is idempotent, and the later run may be the one that
was asked for). Call from the event loop thread only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from pko.machinery.metrics import WorkqueueMetricsProvider
from pko.machinery.workqueue import Queue

__all__ = ["DelayingQueue"]

T = TypeVar("T", bound=Hashable)


class DelayingQueue(Queue[T]):
    """:class:`~pko.machinery.workqueue.Queue` plus ``add_after``."""

    def __init__(
        self,
        name: str = "",
        *,
        metrics: WorkqueueMetricsProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name, metrics=metrics, clock=clock)
        self._waiting: dict[T, asyncio.TimerHandle] = {}

    def add_after(self, item: T, seconds: float) -> None:
        """Add ``item`` once ``seconds`` have passed (now if ``seconds <= 0``)."""
        if self._shutting_down:
            return
        if self._metrics is not None:
            self._metrics.retried()
        if seconds <= 0:
            self.add(item)
            return
        loop = asyncio.get_running_loop()
        ready_at = loop.time() + seconds
        pending = self._waiting.get(item)
        if pending is not None:
            if pending.when() <= ready_at:
                return
            pending.cancel()
        self._waiting[item] = loop.call_at(ready_at, self._fire, item)

    def waiting(self) -> int:
        """How many items are waiting for their timer."""
        return len(self._waiting)

    def shutdown(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for handle in waiting.values():
            handle.cancel()
        super().shutdown()

    def _fire(self, item: T) -> None:
        del self._waiting[item]
        self.add(item)
