"""The tasks that follow running Updates, one per Update, owned by the update controller.

Why not follow an operation inside the reconcile: an ``up`` may run for an hour, and a worker
held that long is a worker the other Updates do not get. The reconcile starts the operation,
hands the rest to a task here and returns; the task follows the operation and, when it ends,
hands the outcome back to the reconcile, the one writer of the Update's status.

The registry runs as a leader-only manager runnable: when leadership ends or the manager stops,
:meth:`UpdateWatches.run` is cancelled and cancels every task (the next leader re-attaches from
its own reconciles: a Progressing Update with no local task gets one). It also remembers, per
operation, the last engine event sequence it logged, so a task re-attached in the same process
replays from there instead of logging the same events twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

__all__ = ["UpdateWatches"]

log = structlog.get_logger("pko.controllers.update.watch")


class UpdateWatches:
    """A registry of watch tasks keyed by the Update's ``namespace/name`` and uid."""

    def __init__(self) -> None:
        self._tasks: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._sequences: dict[str, int] = {}
        self._closed = False

    def running(self, key: str, uid: str) -> bool:
        """A task follows this incarnation of the Update."""
        entry = self._tasks.get(key)
        return entry is not None and entry[0] == uid and not entry[1].done()

    def start(
        self, key: str, uid: str, follow: Callable[[], Awaitable[None]], *, info: dict[str, Any] | None = None
    ) -> bool:
        """Start ``follow()`` for ``key`` unless a task already follows it; False when closed or present.

        A task for another uid (an Update deleted and created again under the same name) is
        cancelled first. ``info`` (the Update as last seen) stays available through :meth:`info`
        while the task runs, for cleaning up after an Update that vanished.
        """
        if self._closed or self.running(key, uid):
            return False
        self.cancel(key)
        if info is not None:
            self._info[key] = info

        async def body() -> None:
            await follow()

        task = asyncio.create_task(body(), name=f"update-watch:{key}")
        self._tasks[key] = (uid, task)
        task.add_done_callback(lambda t: self._finished(key, t))
        return True

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        entry = self._tasks.get(key)
        if entry is not None and entry[1] is task:
            del self._tasks[key]
            self._info.pop(key, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("update watch failed", update=key, exc_info=exc)

    def cancel(self, key: str) -> None:
        """Stop following ``key`` (the Update is gone or complete)."""
        entry = self._tasks.pop(key, None)
        self._info.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    def info(self, key: str) -> dict[str, Any] | None:
        """What :meth:`start` was given for ``key`` while its task runs."""
        return self._info.get(key) if key in self._tasks else None

    def last_sequence(self, uid: str) -> int:
        """The last engine event sequence logged for operation ``uid`` in this process (0: none)."""
        return self._sequences.get(uid, 0)

    def set_sequence(self, uid: str, sequence: int) -> None:
        self._sequences[uid] = sequence

    def forget(self, uid: str) -> None:
        self._sequences.pop(uid, None)

    def __len__(self) -> int:
        return sum(1 for _, task in self._tasks.values() if not task.done())

    async def run(self) -> None:
        """Hold the tasks until cancelled (end of leadership, stop), then cancel them all."""
        self._closed = False
        try:
            await asyncio.Future()
        finally:
            self._closed = True
            tasks = [task for _, task in self._tasks.values()]
            self._tasks.clear()
            self._info.clear()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
