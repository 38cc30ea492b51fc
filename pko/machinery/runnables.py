"""The manager's runnables: long-lived tasks beside the controllers (an artifact server, watch tasks),
each supervised, restarted with backoff when it fails (:meth:`pko.machinery.manager.Manager.add_runnable`).

Kept apart from the manager's run loop, which only says when each set starts and stops: the ones of
every replica with the manager, the ``leader_only`` ones with the controllers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["RUNNABLE_BACKOFF_INITIAL", "RUNNABLE_BACKOFF_MAX", "Runnable", "Runnables"]

RUNNABLE_BACKOFF_INITIAL: Final = 1.0
RUNNABLE_BACKOFF_MAX: Final = 60.0


@dataclass(slots=True)
class Runnable:
    name: str
    fn: Callable[[], Awaitable[None]]
    leader_only: bool
    task: asyncio.Task[None] | None = None


class Runnables:
    """The runnables of one manager, by name; ``log`` is the manager's logger."""

    def __init__(self, log: Any) -> None:
        self._by_name: dict[str, Runnable] = {}
        self._log = log

    def add(self, name: str, fn: Callable[[], Awaitable[None]], *, leader_only: bool) -> Runnable:
        if name in self._by_name:
            raise ValueError(f"a runnable named {name!r} is already added")
        runnable = Runnable(name, fn, leader_only)
        self._by_name[name] = runnable
        return runnable

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def start(self, runnable: Runnable) -> None:
        if runnable.task is None or runnable.task.done():
            runnable.task = asyncio.create_task(self._supervise(runnable), name=f"runnable:{runnable.name}")

    def start_all(self, *, leader_only: bool) -> None:
        for runnable in self._by_name.values():
            if runnable.leader_only == leader_only:
                self.start(runnable)

    async def stop_all(self, *, leader_only: bool) -> None:
        tasks = []
        for runnable in self._by_name.values():
            if runnable.leader_only == leader_only and runnable.task is not None:
                runnable.task.cancel()
                tasks.append(runnable.task)
                runnable.task = None
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _supervise(self, runnable: Runnable) -> None:
        log = self._log.bind(runnable=runnable.name)
        loop = asyncio.get_running_loop()
        delay = RUNNABLE_BACKOFF_INITIAL
        while True:
            started = loop.time()
            try:
                await runnable.fn()
            except Exception as exc:
                if loop.time() - started > RUNNABLE_BACKOFF_MAX:
                    delay = RUNNABLE_BACKOFF_INITIAL  # it ran well for a while: not a crash loop
                log.error("runnable failed; restarting", retry_in=delay, exc_info=exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RUNNABLE_BACKOFF_MAX)
                continue
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                log.error("runnable failed (cancelled from within); restarting", retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RUNNABLE_BACKOFF_MAX)
                continue
            log.info("runnable finished")
            return
