"""Rate limiters: exponential backoff with cap and jitter, fast/slow, token bucket, max-of."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pko.machinery.ratelimit import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    default_controller_rate_limiter,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_exponential_backoff_doubles_per_failure_up_to_the_cap() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.1, cap=1.0)
    assert [limiter.when("a") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert limiter.num_requeues("a") == 6


def test_exponential_backoff_is_per_item_and_forget_resets_it() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.1, cap=10.0)
    limiter.when("a")
    limiter.when("a")
    assert limiter.when("b") == 0.1
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.1


def test_exponential_backoff_survives_thousands_of_failures() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.005, cap=1000.0)
    delays = [limiter.when("a") for _ in range(5000)]
    assert delays[-1] == 1000.0
    assert delays == sorted(delays)


def test_jitter_only_shortens_delays_and_spreads_them() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=1.0, cap=8.0, jitter=0.5, rng=random.Random(7))
    at_cap = []
    for item in range(50):
        for _ in range(5):
            delay = limiter.when(item)
        at_cap.append(delay)
    assert all(4.0 <= d <= 8.0 for d in at_cap)
    assert len(set(at_cap)) > 40, "items at the cap must not retry in lock-step"


@given(
    base=st.floats(1e-4, 10.0),
    cap=st.floats(1e-3, 1e4),
    jitter=st.floats(0.0, 1.0),
    failures=st.integers(1, 200),
)
def test_exponential_delay_is_never_negative_nor_above_the_cap(
    base: float, cap: float, jitter: float, failures: int
) -> None:
    limiter = ItemExponentialFailureRateLimiter(base=base, cap=cap, jitter=jitter, rng=random.Random(0))
    for _ in range(failures):
        delay = limiter.when("x")
        assert 0.0 <= delay <= cap


@pytest.mark.parametrize("kwargs", [{"base": 0.0}, {"cap": -1.0}, {"jitter": 1.5}, {"jitter": -0.1}], ids=str)
def test_exponential_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ItemExponentialFailureRateLimiter(**kwargs)


def test_fast_slow_switches_after_the_fast_attempts() -> None:
    limiter = ItemFastSlowRateLimiter(fast_delay=0.1, slow_delay=5.0, max_fast_attempts=2)
    assert [limiter.when("a") for _ in range(4)] == [0.1, 0.1, 5.0, 5.0]
    limiter.forget("a")
    assert limiter.when("a") == 0.1


def test_bucket_allows_a_burst_then_spaces_retries_at_qps() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=10.0, burst=3, clock=clock)
    assert [limiter.when(i) for i in range(3)] == [0.0, 0.0, 0.0]
    assert [round(limiter.when(i), 9) for i in range(3, 6)] == [0.1, 0.2, 0.3]
    assert limiter.num_requeues(3) == 0


def test_bucket_refills_with_time_but_never_beyond_the_burst() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=10.0, burst=2, clock=clock)
    limiter.when("a")
    limiter.when("a")
    clock.now += 0.1  # one token back
    assert limiter.when("a") == 0.0
    assert limiter.when("a") > 0.0
    clock.now += 3600.0  # a long quiet time refills only up to the burst
    assert [limiter.when("a") for _ in range(2)] == [0.0, 0.0]
    assert limiter.when("a") > 0.0


def test_max_of_takes_the_longest_wait_and_every_limiter_counts_the_failure() -> None:
    clock = FakeClock()
    exp = ItemExponentialFailureRateLimiter(base=0.01, cap=100.0)
    bucket = BucketRateLimiter(qps=1.0, burst=1, clock=clock)
    limiter = MaxOfRateLimiter(exp, bucket)
    assert limiter.when("a") == 0.01  # bucket has a token; exponential says 10ms
    assert limiter.when("a") == pytest.approx(1.0)  # bucket empty: wait for it
    assert exp.num_requeues("a") == 2
    assert limiter.num_requeues("a") == 2
    limiter.forget("a")
    assert exp.num_requeues("a") == 0


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError):
        MaxOfRateLimiter()


def test_default_controller_limiter_matches_controller_runtime() -> None:
    limiter = default_controller_rate_limiter()
    assert limiter.when("a") == 0.005
    assert limiter.when("a") == 0.01
    exp, bucket = limiter.limiters
    assert isinstance(exp, ItemExponentialFailureRateLimiter) and (exp.base, exp.cap) == (0.005, 1000.0)
    assert isinstance(bucket, BucketRateLimiter) and (bucket.qps, bucket.burst) == (10.0, 100)
