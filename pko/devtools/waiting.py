"""Waiting for a condition no event announces: :func:`wait_until`, the one poll helper of the tests.

Its argument order is the one to keep: what is awaited (named in the failure), then the probe.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["wait_until"]


async def wait_until(
    what: str,
    probe: Callable[[], Any | Awaitable[Any]],
    *,
    within: float = 60.0,
    interval: float = 0.25,
) -> Any:
    """``probe()``'s first truthy answer (awaited if ``probe`` is async), polled every ``interval`` s;
    fails naming ``what`` (and the last answer) after ``within`` s."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"{what}: not reached within {within}s (last: {last!r})")
