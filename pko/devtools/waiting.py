"""Waiting for a condition no event announces: the one poller of the tests and the tools, in two
flavours, :func:`wait_until` (async: the tests' event loop) and :func:`until` (blocking: the tools, and
threads without a loop).

Both take the same arguments in the same order, the one to keep: what is awaited (named in the
failure), then the probe, then ``within`` and ``interval`` by name. Both return the probe's first truthy
answer and fail with :class:`NotReached`, which is an ``AssertionError`` (a test's failure) and a
``TimeoutError`` (what a tool catches to give up on one thing and go on).

Standard library only: the node tools use it before the virtualenv exists.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["NotReached", "until", "wait_until"]


class NotReached(AssertionError, TimeoutError):
    """The awaited condition did not hold within the time allowed."""


def _failure(what: str, within: float, last: Any) -> NotReached:
    return NotReached(f"{what}: not reached within {within:g}s (last: {last!r})")


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
    raise _failure(what, within, last)


def until(
    what: str,
    probe: Callable[[], Any],
    *,
    within: float = 60.0,
    interval: float = 0.25,
    transient: tuple[type[BaseException], ...] = (),
) -> Any:
    """``probe()``'s first truthy answer, polled every ``interval`` s, blocking; fails naming ``what``
    (and the last answer) after ``within`` s. An exception of a ``transient`` type counts as no answer
    yet (a tool polling through an apiserver restart asks again)."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except transient as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise _failure(what, within, last)
