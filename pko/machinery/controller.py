"""The controller runner: N workers taking keys from a rate-limited queue and reconciling them.

controller-runtime semantics, asyncio-native:

* a reconciler is ``async def reconcile(key) -> Result``; it knows nothing about queues;
* ``Result.done()`` forgets the key's backoff; ``Result.requeue_after(s)`` forgets it and adds the
  key again after ``s`` seconds; ``Result.requeue()`` is a rate-limited retry without an error;
* any exception is a rate-limited retry, logged as ``Reconciler error`` with the key and counted;
  it never kills the worker. :class:`TerminalError` is logged and counted but not retried (the
  next change to the object enqueues it again). A Kubernetes 409 Conflict is expected under
  optimistic concurrency: a quiet (debug) rate-limited retry, counted as ``requeue``;
* the queue guarantees one worker per key at a time, so reconcilers need no per-key locking.

Every reconcile runs with ``controller``, ``key`` and ``reconcile_id`` bound in structlog's
contextvars, so whatever the reconciler logs carries them too.

Lifecycle: ``start()`` spawns the workers; ``stop(grace_period)`` stops taking new keys, lets
in-flight reconciles finish for up to ``grace_period`` seconds, then cancels them. A stopped
controller cannot be restarted (its queue is shut down); build a new one.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, Protocol

import structlog
from structlog.contextvars import bind_contextvars, reset_contextvars
from structlog.typing import FilteringBoundLogger

from pko.machinery.kubeclient import ApiException
from pko.machinery.metrics import ControllerMetricsProvider, NoopControllerMetrics, ReconcileOutcome
from pko.machinery.ratelimitingqueue import RateLimitingQueue
from pko.machinery.workqueue import ShutDown

__all__ = [
    "CONTROLLER_NAMES",
    "DEFAULT_WORKERS",
    "Controller",
    "Reconciler",
    "Result",
    "TerminalError",
]

# The operator's controller names, as the Go operator names them (they label metrics and logs).
# Here rather than in pko.controllers so the machinery's defaults need no import of the reconcilers.
CONTROLLER_NAMES: Final[tuple[str, ...]] = (
    "stack-controller",
    "workspace-controller",
    "update-controller",
    "program-controller",
)
# Workers per controller: the Go operator runs MAX_CONCURRENT_RECONCILES = 25 for every one.
DEFAULT_WORKERS: Final[Mapping[str, int]] = MappingProxyType(dict.fromkeys(CONTROLLER_NAMES, 25))


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks for next. Build it with the class methods."""

    kind: Literal["done", "requeue", "requeue_after"] = "done"
    delay: float = 0.0

    @classmethod
    def done(cls) -> Result:
        """Converged; reset the key's backoff."""
        return _DONE

    @classmethod
    def requeue(cls) -> Result:
        """Try again after the rate limiter's backoff (no error is logged or counted)."""
        return _REQUEUE

    @classmethod
    def requeue_after(cls, seconds: float) -> Result:
        """Try again in ``seconds`` (a timer, e.g. the next retry time); resets the backoff.

        A delay that is already past (``<= 0``) means "again now": callers often compute it as
        ``deadline - now``.
        """
        if not math.isfinite(seconds):
            raise ValueError(f"requeue_after needs a finite delay, got {seconds}")
        return cls("requeue_after", max(0.0, float(seconds)))


_DONE: Final = Result("done")
_REQUEUE: Final = Result("requeue")


class TerminalError(Exception):
    """Raised by a reconciler when retrying cannot help (e.g. an invalid spec).

    Logged and counted as an error (and in ``controller_runtime_terminal_reconcile_errors_total``)
    but not requeued: the key is reconciled again only when something enqueues it.
    """


class Reconciler(Protocol):
    async def reconcile(self, key: str) -> Result:
        """Make the world match ``key``'s desired state; idempotent and level-triggered."""
        ...


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


class Controller:
    """Runs ``workers`` concurrent reconciles of keys from ``queue``.

    ``queue`` defaults to a :class:`RateLimitingQueue` named after the controller (without
    metrics); ``metrics`` defaults to recording nothing.
    """

    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        queue: RateLimitingQueue[str] | None = None,
        *,
        workers: int = 1,
        logger: FilteringBoundLogger | None = None,
        metrics: ControllerMetricsProvider | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a controller needs at least one worker, got {workers}")
        self.name = name
        self.reconciler = reconciler
        self.queue: RateLimitingQueue[str] = queue if queue is not None else RateLimitingQueue(name)
        self.workers = workers
        # The default stays a lazy proxy: it picks up configure_logging() even if that runs after
        # this controller was built (bind() on a proxy would freeze the configuration of the day).
        self._log: FilteringBoundLogger = (
            logger.bind(controller=name) if logger is not None else structlog.get_logger(controller=name)
        )
        self._metrics = (metrics if metrics is not None else NoopControllerMetrics()).controller_metrics(name)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._active = 0

    @property
    def active_workers(self) -> int:
        """Workers currently inside a reconcile."""
        return self._active

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not self._stopping

    def start(self) -> None:
        """Spawn the workers on the running event loop."""
        if self._stopping:
            raise RuntimeError(f"controller {self.name!r} was stopped; build a new one")
        if self._tasks:
            raise RuntimeError(f"controller {self.name!r} is already running")
        self._metrics.set_max_concurrent_reconciles(self.workers)
        self._log.info("Starting workers", worker_count=self.workers)
        for i in range(self.workers):
            task = asyncio.create_task(self._worker(), name=f"{self.name}-worker-{i}")
            task.add_done_callback(self._worker_exited)
            self._tasks.append(task)

    async def stop(self, grace_period: float = 30.0) -> None:
        """Stop taking keys; wait up to ``grace_period`` s for in-flight reconciles, then cancel them.

        Keys still queued are dropped (the queue is shut down): level-triggered reconcilers pick
        them up again from the informers' initial list when the next leader starts.
        """
        self._stopping = True
        self.queue.shutdown()
        tasks = [t for t in self._tasks if not t.done()]
        if not tasks:
            return
        self._log.info("Stopping workers", in_flight=self._active, grace_period=grace_period)
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, grace_period))
        if pending:
            self._log.warning("Grace period over, cancelling in-flight reconciles", cancelled=self._active)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)
        self._log.info("All workers finished")

    # --- workers -------------------------------------------------------------------------------

    async def _worker(self) -> None:
        queue = self.queue
        while not self._stopping:
            try:
                key = await queue.get()
            except ShutDown:
                return
            if self._stopping:
                queue.done(key)
                return
            await self._process(key)

    async def _process(self, key: str) -> None:
        reconcile_id = uuid.uuid4().hex
        log = self._log.bind(key=key, reconcile_id=reconcile_id)
        self._active += 1
        self._metrics.reconcile_started()
        outcome: ReconcileOutcome | None = None
        started = time.perf_counter()
        # Bound and reset by token: ``bound_contextvars`` first copies the whole context to save
        # what it rebinds after (issue 44: about 1 % of a first pass over idle Stacks).
        tokens = bind_contextvars(controller=self.name, key=key, reconcile_id=reconcile_id)
        try:
            outcome = await self._reconcile(key, log)
            log.debug("Reconcile finished", result=outcome.value, seconds=time.perf_counter() - started)
        finally:
            reset_contextvars(**tokens)
            self._active -= 1
            self._metrics.reconcile_finished(outcome, time.perf_counter() - started)
            self.queue.done(key)

    async def _reconcile(self, key: str, log: FilteringBoundLogger) -> ReconcileOutcome:
        """Run the reconciler once and queue what it asked for; returns how it ended."""
        queue = self.queue
        try:
            result = await self.reconciler.reconcile(key)
            if not isinstance(result, Result):
                raise TypeError(f"reconcile() returned {type(result).__name__}, not a Result")
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being stopped
            # A CancelledError from something the reconciler awaited, not from stop(): a failure.
            log.error("Reconciler error", exc_info=exc)
            queue.add_rate_limited(key)
            return ReconcileOutcome.ERROR
        except TerminalError as exc:
            log.error("Reconciler error", terminal=True, exc_info=exc)
            queue.forget(key)
            return ReconcileOutcome.TERMINAL_ERROR
        except Exception as exc:
            if _is_conflict(exc):
                log.debug("Conflict, requeueing", reason=getattr(exc, "reason", None))
                queue.add_rate_limited(key)
                return ReconcileOutcome.REQUEUE
            log.error("Reconciler error", exc_info=exc)
            queue.add_rate_limited(key)
            return ReconcileOutcome.ERROR

        if result.kind == "requeue_after":
            queue.forget(key)
            queue.add_after(key, result.delay)
            return ReconcileOutcome.REQUEUE_AFTER
        if result.kind == "requeue":
            queue.add_rate_limited(key)
            return ReconcileOutcome.REQUEUE
        queue.forget(key)
        return ReconcileOutcome.SUCCESS

    def _worker_exited(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Only a bug in this module gets here; reconciler failures are caught per key.
            self._log.critical("Worker died", worker=task.get_name(), exc_info=exc)
