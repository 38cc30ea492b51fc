"""A delaying queue whose retries wait as long as a rate limiter says (client-go's rate-limiting queue).

``add_rate_limited(item)`` = ``add_after(item, limiter.when(item))``: each call counts one more
failure of ``item``. ``forget(item)`` clears that history (call it when ``item`` succeeded, or
the backoff never resets). ``num_requeues`` reads it. Everything else is the delaying queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TypeVar

from pko.machinery.delayingqueue import DelayingQueue
from pko.machinery.metrics import WorkqueueMetricsProvider
from pko.machinery.ratelimit import RateLimiter, default_controller_rate_limiter

__all__ = ["RateLimitingQueue"]

T = TypeVar("T", bound=Hashable)


class RateLimitingQueue(DelayingQueue[T]):
    """:class:`~pko.machinery.delayingqueue.DelayingQueue` plus rate-limited retries.

    ``rate_limiter`` defaults to controller-runtime's default (see
    :func:`~pko.machinery.ratelimit.default_controller_rate_limiter`).
    """

    def __init__(
        self,
        name: str = "",
        *,
        rate_limiter: RateLimiter | None = None,
        metrics: WorkqueueMetricsProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name, metrics=metrics, clock=clock)
        self.rate_limiter: RateLimiter = (
            rate_limiter if rate_limiter is not None else default_controller_rate_limiter()
        )

    def add_rate_limited(self, item: T) -> None:
        """Add ``item`` after the backoff its failure history calls for (and count this failure)."""
        if self._shutting_down:
            return
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Reset ``item``'s backoff; it stays queued if it is queued."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self.rate_limiter.num_requeues(item)
