"""Operations owned by the agent, not by an RPC stream.

An operation (preview/up/refresh/destroy) has a caller-chosen id. Starting an id that exists
attaches to it; the operation runs in its own task, so a caller that disconnects does not stop it;
its events and result are journaled (``journal.py``) and can be replayed and followed by any later
caller, including a new operator process after a restart.

Invariants:
* at most one operation runs at a time (Pulumi serialises updates of a stack anyway); starting a
  different id while one runs is refused with ``OperationBusy``;
* an operation's events are numbered 1..n in the order the engine emitted them; its result is the
  last thing a watcher receives, with sequence n+1;
* cancel is graceful and idempotent: the first cancel sends Pulumi one CTRL-C; an operation that
  ends after a cancel without succeeding is CANCELLED with the cancel's reason;
* on shutdown (SIGTERM) the running operation is interrupted the same way and given a grace period,
  then killed; either way its outcome is journaled before the agent exits;
* an operation journaled without a result when the agent starts is recorded as failed
  (AgentRestarted): the process that ran it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from pko.agent.journal import Journal, valid_operation_id
from pko.api.generated.google.protobuf import Struct
from pko.api.generated.pko.agent import v1 as pb
from prometheus_client import Counter, Histogram

log = structlog.get_logger("pko.agent.operations")

# Served on the agent's /metrics (pko.agent.metricsserver), with agent_auth_refusals_total.
OPERATIONS = Counter(
    "agent_operations_total", "Operations the agent finished, by type and final state", ["type", "state"]
)
OPERATION_DURATION = Histogram(
    "agent_operation_duration_seconds",
    "From accepting an operation to its result, by type and final state",
    ["type", "state"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200),
)

OperationRequest = pb.PreviewRequest | pb.UpRequest | pb.RefreshRequest | pb.DestroyRequest
EventSink = Callable[[dict[str, Any]], None]

REASON_CANCELLED = "Cancelled"
REASON_TERMINATED = "Terminated"
REASON_AGENT_RESTARTED = "AgentRestarted"


class Runner(Protocol):
    """What the registry needs from Pulumi (implemented by ``PulumiRunner``)."""

    async def require_stack(self) -> object: ...

    async def run(
        self, operation_id: str, request: OperationRequest, sink: EventSink
    ) -> pb.OperationResult: ...

    def interrupt(self) -> int: ...

    def kill(self) -> int: ...


class OperationError(Exception):
    """A request about operations that cannot be honoured; the message is safe to return."""


class OperationNotFound(OperationError):
    pass


class OperationConflict(OperationError):
    """The id exists with a different operation type."""


class OperationBusy(OperationError):
    """Another operation is running."""


class ShuttingDown(OperationError):
    pass


class InvalidOperationId(OperationError):
    pass


def operation_type(request: OperationRequest) -> pb.OperationType:
    if isinstance(request, pb.PreviewRequest):
        return pb.OperationType.PREVIEW
    if isinstance(request, pb.UpRequest):
        return pb.OperationType.UP
    if isinstance(request, pb.RefreshRequest):
        return pb.OperationType.REFRESH
    return pb.OperationType.DESTROY


@dataclass(eq=False)
class Operation:
    id: str
    type: pb.OperationType
    created: float
    events: list[pb.OperationEvent] = field(default_factory=list)
    result: pb.OperationResult | None = None
    cancel_reason: str | None = None
    task: asyncio.Task[None] | None = None
    # Set (and replaced) whenever events or the result change; watchers wait on the current one.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def state(self) -> pb.OperationState:
        return self.result.state if self.result is not None else pb.OperationState.RUNNING

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def status(self, attached: bool = False) -> pb.OperationStatus:
        return pb.OperationStatus(
            operation_id=self.id,
            type=self.type,
            state=self.state,
            attached=attached,
            last_sequence=len(self.events),
            result=self.result,
        )


def _failed(
    op_id: str, type_: pb.OperationType, reason: str, message: str, state: pb.OperationState
) -> pb.OperationResult:
    now = datetime.now(UTC)
    return pb.OperationResult(
        operation_id=op_id,
        type=type_,
        state=state,
        summary=pb.UpdateSummary(end_time=now, result="failed", message=message),
        failure=pb.Failure(reason=reason, message=message),
    )


class OperationRegistry:
    """Starts, tracks, journals, replays and cancels operations; see the module docstring."""

    def __init__(
        self, runner: Runner, journal: Journal, *, keep_finished: int = 100, keep_in_memory: int = 16
    ):
        self._runner = runner
        self._journal = journal
        self._keep_finished = keep_finished
        self._keep_in_memory = keep_in_memory
        self._ops: OrderedDict[str, Operation] = OrderedDict()
        self._running: Operation | None = None
        self._stopping = False

    @property
    def running(self) -> Operation | None:
        return self._running

    def recover(self) -> int:
        """Record journaled operations that never finished as failed; returns how many."""
        count = 0
        for op_id in self._journal.ids():
            if self._journal.result(op_id) is not None:
                continue
            record = self._journal.load(op_id)
            if record is None:
                continue
            self._journal.write_result(
                _failed(
                    op_id,
                    record.type,
                    REASON_AGENT_RESTARTED,
                    "the agent stopped before the operation finished; "
                    "the stack may hold a lock or pending operations",
                    pb.OperationState.FAILED,
                )
            )
            count += 1
        if count:
            log.warning("recorded unfinished operations as failed", count=count)
        return count

    # -- lookup ---------------------------------------------------------------------------------
    def get(self, operation_id: str) -> Operation:
        op = self._ops.get(operation_id)
        if op is not None:
            return op
        if not valid_operation_id(operation_id):
            raise OperationNotFound(f"operation {operation_id!r} not found")
        record = self._journal.load(operation_id)
        if record is None:
            raise OperationNotFound(f"operation {operation_id!r} not found")
        op = Operation(id=record.id, type=record.type, created=record.created)
        op.events = [
            pb.OperationEvent(sequence=seq, engine_event=Struct.from_dict(ev))
            for seq, ev in self._journal.events(operation_id)
        ]
        op.result = self._journal.result(operation_id)
        if op.result is None:  # journaled by a process that is gone and not yet recovered
            op.result = _failed(
                op.id,
                op.type,
                REASON_AGENT_RESTARTED,
                "the agent stopped before the operation finished",
                pb.OperationState.FAILED,
            )
        self._remember(op)
        return op

    def _remember(self, op: Operation) -> None:
        self._ops[op.id] = op
        finished = [k for k, o in self._ops.items() if o.result is not None]
        for k in finished[: max(0, len(finished) - self._keep_in_memory)]:
            del self._ops[k]

    # -- start / watch / cancel -----------------------------------------------------------------
    async def start(self, request: OperationRequest) -> tuple[Operation, bool]:
        """Start ``request`` or attach to the operation with its id; returns (operation, attached)."""
        type_ = operation_type(request)
        op_id = request.operation_id or f"op-{uuid.uuid4().hex}"
        if not valid_operation_id(op_id):
            raise InvalidOperationId(f"invalid operation id: {op_id!r}")
        existing = self._attachable(op_id, type_)
        if existing is not None:
            return existing, True
        await self._runner.require_stack()
        existing = self._attachable(op_id, type_)  # another caller may have started it meanwhile
        if existing is not None:
            return existing, True
        op = Operation(id=op_id, type=type_, created=time.time())
        self._journal.create(op_id, type_, request.to_dict())
        self._running = op
        self._remember(op)
        op.task = asyncio.create_task(self._execute(op, request), name=f"operation-{op_id}")
        self._prune_journal()
        log.info("operation accepted", operation=op_id, type=type_.name.lower())
        return op, False

    def _attachable(self, op_id: str, type_: pb.OperationType) -> Operation | None:
        try:
            op = self.get(op_id)
        except OperationNotFound:
            op = None
        if op is not None:
            if op.type != type_:
                raise OperationConflict(f"operation {op_id!r} exists and is a {op.type.name.lower()}")
            return op
        if self._stopping:
            raise ShuttingDown("the agent is shutting down")
        if self._running is not None:
            raise OperationBusy(
                f"operation {self._running.id!r} ({self._running.type.name.lower()}) is in progress"
            )
        return None

    async def _execute(self, op: Operation, request: OperationRequest) -> None:
        loop = asyncio.get_running_loop()

        def sink(event: dict[str, Any]) -> None:  # called on Automation API threads
            loop.call_soon_threadsafe(self._append, op, event)

        try:
            result = await self._runner.run(op.id, request, sink)
        except Exception as exc:  # the runner reports failures as results; this is a bug or a precondition
            log.exception("operation crashed", operation=op.id)
            result = _failed(
                op.id, op.type, "OperationFailed", str(exc) or type(exc).__name__, pb.OperationState.FAILED
            )
        # Let events scheduled from the runner's threads land before the result.
        await asyncio.sleep(0)
        self._finish(op, result)

    def _append(self, op: Operation, event: dict[str, Any]) -> None:
        if op.result is not None:
            return  # late event after a forced finish
        sequence = len(op.events) + 1
        self._journal.append_event(op.id, sequence, event)
        op.events.append(pb.OperationEvent(sequence=sequence, engine_event=Struct.from_dict(event)))
        op.notify()

    def _finish(self, op: Operation, result: pb.OperationResult) -> None:
        if op.result is not None:
            return
        result.operation_id = op.id
        result.type = op.type
        if op.cancel_reason is not None and result.state != pb.OperationState.SUCCEEDED:
            result.state = pb.OperationState.CANCELLED
            failure = result.failure or pb.Failure()
            failure.reason = op.cancel_reason
            failure.message = (
                "the operation was cancelled"
                if op.cancel_reason == REASON_CANCELLED
                else "the operation was interrupted because the agent is shutting down"
            )
            result.failure = failure
        self._journal.write_result(result)
        op.result = result
        if self._running is op:
            self._running = None
        op.notify()
        labels = {"type": op.type.name.lower(), "state": result.state.name.lower()}
        OPERATIONS.labels(**labels).inc()
        OPERATION_DURATION.labels(**labels).observe(max(0.0, time.time() - op.created))
        log.info(
            "operation finished",
            operation=op.id,
            state=result.state.name.lower(),
            reason=result.failure.reason if result.failure else "",
        )

    async def watch(self, operation_id: str, from_sequence: int = 1) -> AsyncIterator[pb.OperationEvent]:
        """Events with sequence >= from_sequence, live, then the result."""
        op = self.get(operation_id)
        index = max(from_sequence, 1) - 1
        while True:
            waiter = op.changed
            while index < len(op.events):
                yield op.events[index]
                index += 1
            if op.result is not None:
                yield pb.OperationEvent(sequence=len(op.events) + 1, result=op.result)
                return
            await waiter.wait()

    def cancel(self, operation_id: str, reason: str = REASON_CANCELLED) -> Operation:
        """Interrupt a running operation gracefully (once); a finished one is left as it is."""
        op = self.get(operation_id)
        if op.result is None and op.cancel_reason is None:
            op.cancel_reason = reason
            signalled = self._runner.interrupt()
            log.info("operation cancelled", operation=op.id, reason=reason, signalled=signalled)
        return op

    # -- shutdown -------------------------------------------------------------------------------
    async def shutdown(self, grace: float, kill_wait: float = 30.0) -> None:
        """Refuse new operations; interrupt the running one and wait up to ``grace`` seconds for it."""
        self._stopping = True
        op = self._running
        if op is None or op.task is None:
            self._journal.close()
            return
        if op.cancel_reason is None:
            self.cancel(op.id, REASON_TERMINATED)
        else:
            self._runner.interrupt()
        done, _ = await asyncio.wait({op.task}, timeout=grace)
        if not done:
            log.warning("pulumi did not stop within the grace period; killing it", operation=op.id)
            self._runner.kill()
            done, _ = await asyncio.wait({op.task}, timeout=kill_wait)
        if not done:
            self._finish(
                op,
                _failed(
                    op.id, op.type, REASON_TERMINATED, "pulumi did not stop", pb.OperationState.CANCELLED
                ),
            )
            op.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(op.task, 1)
        self._journal.close()

    def _prune_journal(self) -> None:
        ids = self._journal.ids()
        finished = [i for i in ids if i not in self._ops or self._ops[i].result is not None]
        finished = [i for i in finished if self._journal.result(i) is not None]
        for op_id in finished[: max(0, len(finished) - self._keep_finished)]:
            self._ops.pop(op_id, None)
            self._journal.remove(op_id)
