#!/usr/bin/env python3
"""Workqueue add/get/done cycles per second, in-process, against a bare asyncio.Queue anchor.

Target (issue 4): at least 300k cycles/s, so the queue is never the operator's bottleneck. The
anchor is measured in the same run on the same loop, so the ratio is meaningful on a noisy
machine even when the absolute numbers are not.

Cases (each row: ours vs the anchor doing the same shape of work):
  batch       add 1000 distinct keys, then get+done each; no task switches (the queue's own cost)
  batch+prom  the same with the Prometheus workqueue metrics provider attached
  ratelimited the same on a RateLimitingQueue (what controllers use)
  workers     8 worker tasks in get(), one producer adding batches: includes wake-ups and task switches

Usage: python hack/bench/bench_workqueue.py [--items 1000] [--rounds 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from pko.machinery.metrics import PrometheusWorkqueueMetrics
from pko.machinery.ratelimitingqueue import RateLimitingQueue
from pko.machinery.workqueue import Queue

WORKERS = 8


async def batch_ours(q: Queue[str], keys: list[str], rounds: int) -> int:
    add, get, done = q.add, q.get, q.done
    for _ in range(rounds):
        for k in keys:
            add(k)
        for _ in keys:
            done(await get())
    return rounds * len(keys)


async def batch_anchor(keys: list[str], rounds: int) -> int:
    aq: asyncio.Queue[str] = asyncio.Queue()
    put, get, task_done = aq.put_nowait, aq.get, aq.task_done
    for _ in range(rounds):
        for k in keys:
            put(k)
        for _ in keys:
            await get()
            task_done()
    return rounds * len(keys)


async def _workers(
    add: Callable[[str], None], take: Callable[[], Awaitable[None]], keys: list[str], rounds: int
) -> int:
    """WORKERS tasks loop on ``take``; the producer adds a batch and waits until it is all taken."""
    loop = asyncio.get_running_loop()
    remaining = 0
    batch_done: asyncio.Future[None] = loop.create_future()

    async def worker() -> None:
        nonlocal remaining
        while True:
            await take()
            remaining -= 1
            if remaining == 0:
                batch_done.set_result(None)

    tasks = [asyncio.create_task(worker()) for _ in range(WORKERS)]
    for _ in range(rounds):
        remaining = len(keys)
        batch_done = loop.create_future()
        for k in keys:
            add(k)
        await batch_done
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return rounds * len(keys)


async def workers_ours(keys: list[str], rounds: int) -> int:
    q: Queue[str] = Queue("bench")

    async def take() -> None:
        q.done(await q.get())

    return await _workers(q.add, take, keys, rounds)


async def workers_anchor(keys: list[str], rounds: int) -> int:
    aq: asyncio.Queue[str] = asyncio.Queue()

    async def take() -> None:
        await aq.get()
        aq.task_done()

    return await _workers(aq.put_nowait, take, keys, rounds)


async def best_rate(run: Callable[[], Awaitable[int]], repeat: int) -> float:
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        n = await run()
        best = max(best, n / (time.perf_counter() - start))
    return best


async def main(items: int, rounds: int, repeat: int) -> None:
    keys = [f"ns-{i % 7}/stack-{i}" for i in range(items)]
    cases: list[tuple[str, Callable[[], Awaitable[int]], Callable[[], Awaitable[int]]]] = [
        ("batch", lambda: batch_ours(Queue("bench"), keys, rounds), lambda: batch_anchor(keys, rounds)),
        (
            "batch+prom",
            lambda: batch_ours(
                Queue("bench", metrics=PrometheusWorkqueueMetrics(CollectorRegistry())), keys, rounds
            ),
            lambda: batch_anchor(keys, rounds),
        ),
        (
            "ratelimited",
            lambda: batch_ours(RateLimitingQueue("bench"), keys, rounds),
            lambda: batch_anchor(keys, rounds),
        ),
        ("workers", lambda: workers_ours(keys, rounds), lambda: workers_anchor(keys, rounds)),
    ]
    for _, ours, anchor in cases:  # warm-up: first runs pay for allocations and imports
        await ours()
        await anchor()
    print("| case | workqueue cycles/s | asyncio.Queue cycles/s (anchor) | ratio | >= 300k/s |")
    print("|---|---:|---:|---:|:-:|")
    for name, ours, anchor in cases:
        # Interleave so both see the same machine load.
        r_anchor = await best_rate(anchor, repeat)
        r_ours = await best_rate(ours, repeat)
        ok = "yes" if r_ours >= 300_000 else "no"
        print(f"| {name} | {r_ours:,.0f} | {r_anchor:,.0f} | {r_ours / r_anchor:.2f} | {ok} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=1000, help="distinct keys per round")
    parser.add_argument("--rounds", type=int, default=200, help="rounds per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per case (best is kept)")
    args = parser.parse_args()
    asyncio.run(main(args.items, args.rounds, args.repeat))
