"""Rate limiters for retries: how long an item waits before its next attempt.

Same shapes as client-go's ``default_rate_limiters.go`` so operators behave the way platform teams
expect, and they compose:

* :class:`ItemExponentialFailureRateLimiter` -- per item, ``base * 2**failures`` capped at ``cap``,
  optionally jittered so a burst of failing items does not retry in lock-step.
* :class:`ItemFastSlowRateLimiter` -- per item, a few quick retries, then slow ones.
* :class:`BucketRateLimiter` -- one token bucket shared by all items: bounds the overall retry rate.
* :class:`MaxOfRateLimiter` -- the longest wait any of its limiters asks for.

:func:`default_controller_rate_limiter` is controller-runtime's default (exponential 5ms..1000s,
max-of a 10 qps / burst 100 bucket).

A limiter's state lives in the limiter: ``when`` records a failure, ``forget`` clears an item's
history (call it on success), ``num_requeues`` reports the failures counted so far. Limiters are
used from one event loop thread and take no locks.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable
from typing import Protocol

__all__ = [
    "BucketRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "default_controller_rate_limiter",
]


class RateLimiter(Protocol):
    """Decides how long an item waits before it is retried."""

    def when(self, item: Hashable) -> float:
        """Record one more failure of ``item``; return the seconds to wait before retrying it."""
        ...

    def forget(self, item: Hashable) -> None:
        """Drop ``item``'s failure history (it succeeded, or is gone)."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many failures of ``item`` are currently counted."""
        ...


class ItemExponentialFailureRateLimiter:
    """Per-item exponential backoff: ``base * 2**n`` seconds after the n-th failure, at most ``cap``.

    ``jitter`` (0..1) draws the delay uniformly from ``[d * (1 - jitter), d]``: jitter only ever
    shortens a delay, so the cap stays a hard upper bound and items that all reached the cap still
    spread out instead of retrying together.
    """

    def __init__(
        self,
        base: float = 0.005,
        cap: float = 1000.0,
        *,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if base <= 0 or cap <= 0:
            raise ValueError(f"base and cap must be positive (base={base}, cap={cap})")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {jitter}")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._failures: dict[Hashable, int] = {}
        # Past this exponent base * 2**n exceeds cap anyway; stop before floats overflow.
        self._max_exponent = max(0, math.ceil(math.log2(cap / base))) if cap > base else 0

    def when(self, item: Hashable) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        delay = self.cap if exp > self._max_exponent else min(self.cap, self.base * 2.0**exp)
        if self.jitter:
            delay *= 1.0 - self.jitter * self._rng.random()
        return delay

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class ItemFastSlowRateLimiter:
    """Per item: ``fast_delay`` for the first ``max_fast_attempts`` failures, ``slow_delay`` after."""

    def __init__(self, fast_delay: float, slow_delay: float, max_fast_attempts: int) -> None:
        if fast_delay < 0 or slow_delay < 0 or max_fast_attempts < 0:
            raise ValueError("delays and max_fast_attempts must not be negative")
        self.fast_delay = fast_delay
        self.slow_delay = slow_delay
        self.max_fast_attempts = max_fast_attempts
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        n = self._failures.get(item, 0) + 1
        self._failures[item] = n
        return self.fast_delay if n <= self.max_fast_attempts else self.slow_delay

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """One token bucket for all items: at most ``burst`` retries at once, ``qps`` per second after.

    ``when`` reserves a token now and returns how long until that token exists, so a burst of
    failures is spread out at ``qps`` instead of being refused. It keeps no per-item state.
    """

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"qps must be positive and burst at least 1 (qps={qps}, burst={burst})")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, item: Hashable) -> float:
        now = self._clock()
        # Tokens may go negative: that debt is the queue of reservations not yet due.
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps) - 1.0
        self._last = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest wait any of ``limiters`` asks for; every limiter sees every failure."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        # Not max(generator) with short-circuit tricks: each limiter must record the failure.
        return max([limiter.when(item) for limiter in self.limiters])

    def forget(self, item: Hashable) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter(*, jitter: float = 0.0) -> MaxOfRateLimiter:
    """controller-runtime's default: per-item 5ms doubling to 1000s, overall 10 qps with burst 100."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0, jitter=jitter),
        BucketRateLimiter(qps=10.0, burst=100),
    )
