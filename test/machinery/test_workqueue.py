"""Workqueue semantics (client-go's): de-duplication, one holder per item, re-queue after done,
delays, shutdown and drain -- and the same properties under many random interleavings."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pko.devtools.waiting import wait_until
from pko.machinery.delayingqueue import DelayingQueue
from pko.machinery.ratelimit import ItemFastSlowRateLimiter
from pko.machinery.ratelimitingqueue import RateLimitingQueue
from pko.machinery.workqueue import Queue, ShutDown

TIMEOUT = 10.0  # generous: the machine is shared; nothing here asserts speed


async def take(q: Queue[str]) -> str:
    async with asyncio.timeout(TIMEOUT):
        return await q.get()


# Polls a condition of the system under test (no event exists for it), often, with a generous limit.
eventually = functools.partial(
    wait_until, "a condition of the system under test", within=TIMEOUT, interval=0.001
)


async def settle() -> None:
    """Let every ready task run until they are all blocked again."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- basic queue -----------------------------------------------------------------------------


async def test_adding_a_queued_item_again_is_a_no_op() -> None:
    q: Queue[str] = Queue()
    for key in ["a", "b", "a", "a", "b", "c"]:
        q.add(key)
    assert len(q) == 3
    assert [await take(q) for _ in range(3)] == ["a", "b", "c"]


async def test_item_added_while_processing_is_requeued_after_done_not_before() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    assert await take(q) == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0, "a held item must not be handed to a second worker"
    q.done("a")
    assert len(q) == 1
    assert await take(q) == "a"
    q.done("a")
    assert len(q) == 0 and q.processing == 0


async def test_requeued_item_goes_to_the_tail_so_a_hot_key_cannot_starve_others() -> None:
    q: Queue[str] = Queue()
    for key in ["hot", "a", "b", "c"]:
        q.add(key)
    order = []
    for _ in range(5):
        key = await take(q)
        order.append(key)
        if key == "hot":
            q.add("hot")  # changes constantly
        q.done(key)
    assert order == ["hot", "a", "b", "c", "hot"]


async def test_hot_key_with_many_workers_does_not_starve_others() -> None:
    q: Queue[str] = Queue()
    others = [f"k{i}" for i in range(50)]
    seen: list[str] = []

    async def worker() -> None:
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            seen.append(key)
            q.add("hot")  # every reconcile of anything touches the hot key
            await asyncio.sleep(0)
            q.done(key)

    q.add("hot")
    for key in others:
        q.add(key)
    workers = [asyncio.create_task(worker()) for _ in range(4)]
    await eventually(lambda: set(others) <= set(seen))
    q.shutdown()
    await asyncio.gather(*workers)
    # The hot key re-enters at the tail: every other key is handed out before it comes round again.
    all_others_seen_at = max(seen.index(key) for key in others)
    assert seen[: all_others_seen_at + 1].count("hot") <= 2
    assert set(seen) == {"hot", *others}


async def test_done_for_an_item_not_being_processed_is_an_error() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    with pytest.raises(ValueError, match="not being processed"):
        q.done("a")
    assert len(q) == 1, "the failed done must not have duplicated the item"


async def test_get_waits_for_an_add() -> None:
    q: Queue[str] = Queue()
    getter = asyncio.create_task(take(q))
    await settle()
    assert not getter.done()
    q.add("a")
    assert await getter == "a"
    q.done("a")


async def test_each_waiting_worker_gets_a_different_item() -> None:
    q: Queue[str] = Queue()
    getters = [asyncio.create_task(take(q)) for _ in range(3)]
    await settle()
    for key in ["a", "b", "c"]:
        q.add(key)
    assert sorted(await asyncio.gather(*getters)) == ["a", "b", "c"]


async def test_a_cancelled_getter_passes_its_wakeup_on() -> None:
    q: Queue[str] = Queue()
    first = asyncio.create_task(take(q))
    second = asyncio.create_task(take(q))
    await settle()
    q.add("a")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == "a"


async def test_shutdown_ignores_adds_hands_out_the_rest_then_raises() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    q.add("b")
    q.shutdown()
    q.add("c")
    assert q.shutting_down
    assert [await take(q), await take(q)] == ["a", "b"]
    with pytest.raises(ShutDown):
        await take(q)


async def test_shutdown_releases_blocked_getters() -> None:
    q: Queue[str] = Queue()
    getters = [asyncio.create_task(take(q)) for _ in range(3)]
    await settle()
    q.shutdown()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, ShutDown) for r in results)


async def test_shutdown_with_drain_waits_for_in_flight_and_requeued_items() -> None:
    q: Queue[str] = Queue()
    q.add("a")
    assert await take(q) == "a"
    q.add("a")  # dirty while processing: must still be processed before the drain completes
    q.add("b")
    drain = asyncio.create_task(q.shutdown_with_drain())
    await settle()
    assert not drain.done()
    q.done("a")
    processed = []
    for _ in range(2):
        key = await take(q)
        processed.append(key)
        await settle()
        assert not drain.done()
        q.done(key)
    async with asyncio.timeout(TIMEOUT):
        await drain
    assert sorted(processed) == ["a", "b"]


async def test_shutdown_with_drain_on_an_idle_queue_returns_at_once() -> None:
    q: Queue[str] = Queue()
    async with asyncio.timeout(TIMEOUT):
        await q.shutdown_with_drain()


# --- delaying queue ---------------------------------------------------------------------------


async def test_add_after_adds_only_once_the_delay_passed() -> None:
    loop = asyncio.get_running_loop()
    q: DelayingQueue[str] = DelayingQueue()
    start = loop.time()
    q.add_after("a", 0.05)
    assert len(q) == 0 and q.waiting() == 1
    assert await take(q) == "a"
    assert loop.time() - start >= 0.05
    assert q.waiting() == 0


async def test_add_after_keeps_the_earlier_ready_time() -> None:
    loop = asyncio.get_running_loop()
    q: DelayingQueue[str] = DelayingQueue()
    start = loop.time()
    q.add_after("a", 30.0)
    q.add_after("a", 0.02)  # brought forward
    q.add_after("a", 60.0)  # cannot push it back
    assert q.waiting() == 1
    assert await take(q) == "a"
    assert loop.time() - start < 30.0
    q.done("a")
    assert q.waiting() == 0


async def test_add_after_without_delay_adds_now() -> None:
    q: DelayingQueue[str] = DelayingQueue()
    q.add_after("a", 0)
    q.add_after("b", -1.0)
    assert len(q) == 2 and q.waiting() == 0


async def test_delayed_item_held_by_a_worker_is_requeued_after_done() -> None:
    q: DelayingQueue[str] = DelayingQueue()
    q.add("a")
    assert await take(q) == "a"
    q.add_after("a", 0.01)
    await eventually(lambda: q.waiting() == 0)
    assert len(q) == 0
    q.done("a")
    assert await take(q) == "a"


async def test_shutdown_drops_waiting_items() -> None:
    q: DelayingQueue[str] = DelayingQueue()
    q.add_after("a", 0.01)
    q.shutdown()
    q.add_after("b", 0.01)
    assert q.waiting() == 0
    await asyncio.sleep(0.05)
    with pytest.raises(ShutDown):
        await take(q)


# --- rate-limiting queue ----------------------------------------------------------------------


async def test_add_rate_limited_waits_as_the_limiter_says_and_forget_resets() -> None:
    loop = asyncio.get_running_loop()
    q: RateLimitingQueue[str] = RateLimitingQueue(
        rate_limiter=ItemFastSlowRateLimiter(fast_delay=0.02, slow_delay=3600.0, max_fast_attempts=1)
    )
    start = loop.time()
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 1
    assert await take(q) == "a"
    assert loop.time() - start >= 0.02
    q.done("a")
    q.add_rate_limited("a")  # second failure: the slow delay
    assert q.waiting() == 1 and len(q) == 0
    q.forget("a")
    assert q.num_requeues("a") == 0
    q.shutdown()


# --- concurrency properties under random interleavings ------------------------------------------


def run_fresh_loop(coro: Coroutine[Any, Any, None]) -> None:
    """One private loop per hypothesis example, so the examples are independent."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coro)
    finally:
        loop.close()


async def exercise(
    q: Queue[str],
    script: list[tuple[str, int]],
    work_yields: list[int],
    workers: int,
    add: Any,
) -> None:
    """Run ``workers`` against a producer following ``script``; check the queue's promises.

    script: ("add", key) adds key; ("yield", n) lets other tasks run n times.
    work_yields: how many times each successive reconcile yields while holding its item.
    """
    clock = itertools.count()
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    holders: dict[str, int] = {}
    shared: list[str] = []
    durations = itertools.cycle(work_yields or [0])

    async def worker() -> None:
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            holders[key] = holders.get(key, 0) + 1
            if holders[key] > 1:
                shared.append(key)
            last_start[key] = next(clock)
            for _ in range(next(durations)):
                await asyncio.sleep(0)
            holders[key] -= 1
            q.done(key)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    for op, arg in script:
        if op == "add":
            key = f"k{arg}"
            last_add[key] = next(clock)
            add(key)
        else:
            for _ in range(arg):
                await asyncio.sleep(0)
    if isinstance(q, DelayingQueue):
        await eventually(lambda: q.waiting() == 0)
    async with asyncio.timeout(TIMEOUT):
        await q.shutdown_with_drain()
        await asyncio.gather(*tasks)

    assert not shared, f"items held by two workers at once: {shared}"
    assert len(q) == 0 and q.processing == 0
    for key, added in last_add.items():
        assert last_start.get(key, -1) > added, f"{key} added at {added} but never processed after it"


script_steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 7)),
        st.tuples(st.just("yield"), st.integers(0, 4)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=script_steps,
    work_yields=st.lists(st.integers(0, 5), max_size=10),
    workers=st.integers(1, 6),
)
def test_random_interleavings_never_share_an_item_lose_an_add_or_miss_the_drain(
    script: list[tuple[str, int]], work_yields: list[int], workers: int
) -> None:
    q: Queue[str] = Queue("prop")
    run_fresh_loop(exercise(q, script, work_yields, workers, q.add))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=script_steps,
    work_yields=st.lists(st.integers(0, 5), max_size=10),
    workers=st.integers(1, 6),
    delays=st.lists(st.sampled_from([0.0, 0.001, 0.003]), min_size=1, max_size=8),
)
def test_random_interleavings_with_delayed_adds(
    script: list[tuple[str, int]], work_yields: list[int], workers: int, delays: list[float]
) -> None:
    q: DelayingQueue[str] = DelayingQueue("prop-delay")
    cycle = itertools.cycle(delays)

    def add(key: str) -> None:
        q.add_after(key, next(cycle))

    run_fresh_loop(exercise(q, script, work_yields, workers, add))
