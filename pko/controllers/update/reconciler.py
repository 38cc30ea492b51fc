"""The Update reconciler: run one Pulumi operation through the workspace agent and record its result.

The Go operator's update controller, with operations owned by the agent:

* An Update waits for its Workspace to be Ready (``WorkspaceNotFound``/``WorkspaceNotReady``; the
  Workspace watch wakes it, no polling), then selects the stack (every time: the selection lives
  in the agent's memory) and calls ``StartOperation`` with the Update's uid as the operation id.
  Starting the same id again attaches, so a retried reconcile never runs an operation twice.
* The reconcile returns once the operation runs; a task per running Update (``watch.py``) follows
  ``WatchOperation`` and, when the operation ends, hands its outcome to the reconcile (a
  :class:`~pko.machinery.manager.KeyChannel`). A Progressing Update with no local task (an
  operator restart, a new leader) gets one: ``GetOperation`` first, then the watch.
* The reconcile is the one writer of an Update's status. The result is recorded once: the write
  carries the resourceVersion it was computed from, so a write from a stale read gets 409 and the
  outcome is kept and written again from a fresh read; a recorded result is never rewritten.
* No Update stays Progressing forever: an agent that no longer knows the operation (pod replaced)
  ends it ``OperationLost``; the agent's own results say ``AgentRestarted``/``Terminated``; an agent
  unreachable beyond a budget ends it ``AgentUnreachable``. A Workspace whose readiness flaps does
  not fail a running Update (upstream PR 1155): only the agent's answers do.
* A completed Update is deleted after ``ttlAfterCompleted``, never before the Stack that created it
  recorded it; a deleting, completed, recorded Update loses the Stack's finalizer (upstream 1060).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from kubernetes_asyncio.client import ApiException

from pko.agentclient import AgentClient, AgentError, audience, resolve_address
from pko.api.generated.pko.agent import v1 as pb
from pko.api.meta import parse_go_duration
from pko.api.update import CONDITION_COMPLETE
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import (
    FIELD_MANAGER_UPDATE_STATUS,
    STACK_FINALIZER,
    STACK_NAME_LABEL,
    STACKS,
    UPDATES,
    WORKSPACE_SELECTOR,
    WORKSPACES,
)
from pko.controllers.update import status as us
from pko.controllers.update.watch import UpdateWatches
from pko.machinery.conditions import get_condition, is_true
from pko.machinery.controller import Result
from pko.machinery.events import Recorder
from pko.machinery.manager import KeyChannel, Manager
from pko.machinery.objects import controller_of, has_finalizer, remove_finalizer
from pko.machinery.predicates import (
    condition_became,
    deletion_started,
    generation_changed,
    or_,
    owner_references_changed,
)
from pko.machinery.resource import PODS, SECRETS, Obj, ResourceClient, api_error_status
from pko.machinery.store import index_by_field, object_key
from pko.machinery.writes import StatusWriter
from pko.tokens import TokenSource

__all__ = ["WORKSPACE_INDEX", "UpdateReconciler", "setup"]

CONTROLLER_NAME: Final = "update-controller"
WORKSPACE_INDEX: Final = "update-workspace"
TRANSIENT_REQUEUE: Final = 5.0  # the Go operator's requeue after a TransientFailure
STACK_RECORD_RECHECK: Final = 60.0  # a fallback: the Stack watch normally wakes a waiting TTL
RECORD_RETRY: Final = 1.0  # a result write refused as stale is tried again this soon


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How an operation ended, waiting to be written: the agent's ``result``, or an end without one
    (``reason``, ``message``)."""

    uid: str
    result: pb.OperationResult | None = None
    reason: str = ""
    message: str = ""


_log = structlog.get_logger("pko.controllers.update.reconciler")

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Unreachable(Exception):
    """The agent has no address yet (pod-ip mode, pod without an IP) or its workspace is gone."""


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return object_key(meta.get("namespace"), str(meta.get("name", "")))


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _stack_owner(update: Obj) -> str | None:
    for ref in (update.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Stack" and str(ref.get("apiVersion", "")).startswith("pulumi.com/"):
            return str(ref.get("name"))
    return None


def _last_update_name(stack: Obj | None) -> str | None:
    if stack is None:
        return None
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    name = last.get("name")
    return str(name) if name else None


def _stack_last_update_keys(stack: Obj) -> list[str]:
    name = _last_update_name(stack)
    return [object_key((stack.get("metadata") or {}).get("namespace"), name)] if name else []


def _stack_last_update_changed(old: Obj | None, new: Obj | None) -> bool:
    if old is None or new is None:
        return new is not None
    return _last_update_name(old) != _last_update_name(new)


class UpdateReconciler:
    """Reconciles Updates from the caches; see the module docstring.

    ``options.agent_unreachable_timeout`` (seconds) bounds how long a running Update waits for its
    agent to answer again before it ends ``AgentUnreachable``.
    """

    def __init__(
        self,
        manager: Manager,
        options: ControllerOptions | None = None,
        *,
        tokens: TokenSource | None = None,
        events: Recorder | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.options = options = options or ControllerOptions()
        self.api = manager.api
        self.updates = manager.informer(
            UPDATES, indexers={WORKSPACE_INDEX: index_by_field("spec.workspaceName", namespaced=True)}
        )
        self.workspaces = manager.informer(WORKSPACES)
        self.stacks = manager.informer(STACKS)
        self.pods = manager.informer(PODS, label_selector=WORKSPACE_SELECTOR)
        self.tokens = tokens or options.operator_tokens(manager)
        self.events: Recorder = events if events is not None else manager.events
        self.watches = UpdateWatches()
        # Outcomes of ended operations not yet written (the reconcile writes them), by key.
        self._outcomes: dict[str, _Outcome] = {}
        self.wake = KeyChannel()
        self.lost_agent_budget = options.agent_unreachable_timeout
        self.connect_timeout = connect_timeout
        self._update_client = ResourceClient(manager.api, UPDATES)
        self.status_writer = StatusWriter(
            self.updates,
            FIELD_MANAGER_UPDATE_STATUS,
            us.STATUS_FIELDS,
            client=self._update_client,
            force=True,
        )
        self._secrets = ResourceClient(manager.api, SECRETS)
        self._engine_level = _LEVELS.get(options.engine_event_log_level.strip().lower(), logging.DEBUG)

    # --- reconcile -------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        update = self.updates.latest(key)
        if update is None:
            self._outcomes.pop(key, None)
            await self._gone(key)
            return Result.done()
        uid = _uid(update)
        outcome = self._outcomes.get(key)
        if outcome is not None:
            if outcome.uid == uid and not us.is_complete(update):
                return await self._write_outcome(update, outcome)
            del self._outcomes[key]
        if us.is_complete(update):
            # Its watch task (if any) ends by itself once it sees the Update complete.
            return await self._completed(update)
        meta = update.get("metadata") or {}
        ending = bool(meta.get("deletionTimestamp")) or controller_of(update) is None
        if us.is_running(update):
            if ending:
                return await self._cancel(update)
            self._follow_in_background(update)
            return Result.done()
        if meta.get("deletionTimestamp"):
            return await self._end(
                update, us.REASON_CANCELED, "the Update was deleted before its operation started"
            )
        if controller_of(update) is None:
            return await self._end(
                update, us.REASON_CANCELED, "the Update has no controlling owner (orphaned)"
            )
        return await self._start(update)

    async def _gone(self, key: str) -> None:
        """The Update vanished (deleted without a finalizer): cancel its operation, best effort."""
        last = self.watches.info(key)
        self.watches.cancel(key)
        if last is None:
            return
        self.watches.forget(_uid(last))
        with contextlib.suppress(AgentError, _Unreachable, TimeoutError):
            async with asyncio.timeout(self.connect_timeout):
                async with self._agent(last) as client:
                    await client.cancel_operation(_uid(last))

    # --- start ------------------------------------------------------------------------------------

    def _workspace(self, update: Obj) -> Obj | None:
        meta = update.get("metadata") or {}
        name = (update.get("spec") or {}).get("workspaceName")
        if not name:
            return None
        return self.workspaces.indexer.get_by_key(object_key(meta.get("namespace"), str(name)))

    async def _wait(self, update: Obj, reason: str, message: str, requeue: float | None = None) -> Result:
        """Record why the Update has not started (only when that changed), then wait."""
        await self._apply_status(update, us.waiting_status(update, reason, message))
        return Result.requeue_after(requeue) if requeue is not None else Result.done()

    async def _start(self, update: Obj) -> Result:
        ws = self._workspace(update)
        ws_name = (update.get("spec") or {}).get("workspaceName")
        if ws is None:
            return await self._wait(update, us.REASON_WORKSPACE_NOT_FOUND, f"workspace {ws_name!r} not found")
        if not is_true((ws.get("status") or {}).get("conditions"), "Ready"):
            return await self._wait(
                update, us.REASON_WORKSPACE_NOT_READY, f"workspace {ws_name!r} is not ready"
            )
        try:
            request = us.operation_request(update)
        except ValueError as exc:
            return await self._end(update, us.REASON_UPDATE_FAILED, str(exc))
        stack_name = str((update.get("spec") or {}).get("stackName") or "")
        try:
            async with self._agent(update) as client:
                await client.select_stack(stack_name, create=True, secrets_provider=None)
                op = await client.start_operation(request)
        except _Unreachable as exc:
            return await self._wait(update, us.REASON_TRANSIENT_FAILURE, str(exc), TRANSIENT_REQUEUE)
        except AgentError as exc:
            if exc.transient or exc.code in ("ABORTED", "FAILED_PRECONDITION"):
                # Unreachable, or busy with another operation: try again shortly.
                message = f"{exc.reason}: {exc.message}"
                return await self._wait(update, us.REASON_TRANSIENT_FAILURE, message, TRANSIENT_REQUEUE)
            return await self._end(update, exc.reason or us.REASON_UPDATE_FAILED, exc.message)
        if op.result is not None:
            # Attached to an operation that already finished (its earlier start was not recorded).
            return await self._record(update, op.result)
        await self._apply_status(update, us.started_status(update))
        _log.info("update started", update=_key(update), operation=_uid(update), attached=op.attached)
        self._follow_in_background(update)
        return Result.done()

    # --- agent ------------------------------------------------------------------------------------

    def _agent(self, update: Obj) -> AgentClient:
        meta = update.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        ws_name = str((update.get("spec") or {}).get("workspaceName") or "")
        pod = None
        if self.options.workspace_address_mode == "pod-ip":
            pod = self.pods.indexer.get_by_key(object_key(namespace, f"{ws_name}-workspace-0"))
        address = resolve_address(
            ws_name,
            namespace,
            mode=self.options.workspace_address_mode,
            pod=pod,
            static=self.options.workspace_static_address,
        )
        if address is None:
            raise _Unreachable(f"the pod of workspace {ws_name!r} has no address yet")
        return AgentClient(
            address, audience(ws_name, namespace), self.tokens, connect_timeout=self.connect_timeout
        )

    # --- following a running operation ------------------------------------------------------------

    def _follow_in_background(self, update: Obj) -> None:
        key, uid = _key(update), _uid(update)
        self.watches.start(key, uid, lambda: self._follow(key, uid), info=update)

    def _engine_logger(self, update: Obj) -> Any:
        meta = update.get("metadata") or {}
        return _log.bind(
            update=meta.get("name"),
            namespace=meta.get("namespace"),
            workspace=(update.get("spec") or {}).get("workspaceName"),
            stack=(meta.get("labels") or {}).get(STACK_NAME_LABEL),
        )

    async def _follow(self, key: str, uid: str) -> None:
        """Follow operation ``uid`` until its result is recorded (or the Update is gone or complete)."""
        lost_since: float | None = None
        failures = 0
        last_error = ""
        loop = asyncio.get_running_loop()
        while True:
            update = self.updates.latest(key)
            if update is None or _uid(update) != uid or us.is_complete(update):
                return
            engine_log = self._engine_logger(update)
            try:
                async with self._agent(update) as client:
                    status = await client.get_operation(uid)
                    if status.result is not None:
                        self._conclude(key, _Outcome(uid, result=status.result))
                        return
                    lost_since, failures = None, 0
                    start = self.watches.last_sequence(uid) + 1
                    async for event in client.watch_operation(uid, from_sequence=start):
                        if event.result is not None:
                            self._conclude(key, _Outcome(uid, result=event.result))
                            return
                        if event.engine_event is not None and event.sequence >= start:
                            engine_log.log(
                                self._engine_level,
                                "engine event",
                                engine_event=event.engine_event.to_dict(),
                                sequence=event.sequence,
                            )
                            self.watches.set_sequence(uid, event.sequence)
                last_error = "the agent ended the watch without a result"
            except AgentError as exc:
                if exc.code == "NOT_FOUND":
                    message = (
                        "the workspace agent no longer knows this operation: the workspace pod was "
                        f"replaced or lost its journal ({exc.message})"
                    )
                    self._conclude(key, _Outcome(uid, reason=us.REASON_OPERATION_LOST, message=message))
                    return
                last_error = f"{exc.reason}: {exc.message}"
            except _Unreachable as exc:
                last_error = str(exc)
            except Exception as exc:  # a bug must not leave the Update Progressing without a watcher
                _log.error("update watch failed; retrying", update=key, exc_info=exc)
                last_error = f"{type(exc).__name__}: {exc}"
            now = loop.time()
            lost_since = now if lost_since is None else lost_since
            failures += 1
            if now - lost_since >= self.lost_agent_budget:
                message = f"lost contact with the workspace agent for {now - lost_since:.0f}s: {last_error}"
                self._conclude(key, _Outcome(uid, reason=us.REASON_UNREACHABLE, message=message))
                return
            _log.info("update watch interrupted; retrying", update=key, error=last_error, attempt=failures)
            delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.8, 1.2)
            await asyncio.sleep(min(delay, max(0.1, lost_since + self.lost_agent_budget - now)))

    async def _cancel(self, update: Obj) -> Result:
        """A running Update being deleted (or orphaned): cancel its operation; the watch records it."""
        try:
            async with self._agent(update) as client:
                status = await client.cancel_operation(_uid(update))
        except _Unreachable as exc:
            return await self._cancel_failed(update, str(exc), transient=True)
        except AgentError as exc:
            transient = exc.transient and exc.code != "NOT_FOUND"
            return await self._cancel_failed(update, f"{exc.reason}: {exc.message}", transient=transient)
        if status.result is not None:
            return await self._record(update, status.result)
        self._follow_in_background(update)
        return Result.done()

    async def _cancel_failed(self, update: Obj, detail: str, *, transient: bool) -> Result:
        """The cancel did not reach the agent: while a watch task still follows the operation (it
        ends it within its budget) try again; otherwise end the Update here."""
        if transient and self.watches.running(_key(update), _uid(update)):
            return Result.requeue_after(TRANSIENT_REQUEUE)
        return await self._end(
            update, us.REASON_CANCELED, f"the Update was canceled; its operation could not be: {detail}"
        )

    # --- recording --------------------------------------------------------------------------------

    async def _apply_status(self, update: Obj, status: Obj) -> Obj | None:
        """Write ``status`` if it changed, preconditioned on the resourceVersion read: a write from
        a stale read fails (409), which is what makes recording a result happen once."""
        return await self.status_writer.write(update, status, precondition=True)

    def _conclude(self, key: str, outcome: _Outcome) -> None:
        """A watch task's last act: hand the outcome to the reconcile, the one writer."""
        self._outcomes[key] = outcome
        self.wake.send(key)

    async def _write_outcome(self, update: Obj, outcome: _Outcome) -> Result:
        """Write a pending outcome (read fresh: the reconcile checked it is not complete); keep it
        while the write is refused as stale."""
        key = _key(update)
        try:
            if outcome.result is not None:
                await self._write_result(update, outcome.result)
            else:
                await self._write_end(update, outcome.reason, outcome.message)
        except ApiException as exc:
            code = api_error_status(exc)
            if code == 409:
                return Result.requeue_after(RECORD_RETRY)  # a stale read: again, from the cache
            if code != 404:
                raise
        self._outcomes.pop(key, None)
        self.watches.forget(outcome.uid)
        return Result.done()

    async def _record(self, update: Obj, result: pb.OperationResult) -> Result:
        """Record a finished operation's result (once), its outputs Secret, and an Event."""
        return await self._write_outcome(update, self._pending(update, _Outcome(_uid(update), result=result)))

    async def _end(self, update: Obj, reason: str, message: str) -> Result:
        """End the Update without a result from the agent (Failed with ``reason``)."""
        outcome = _Outcome(_uid(update), reason=reason, message=message)
        return await self._write_outcome(update, self._pending(update, outcome))

    def _pending(self, update: Obj, outcome: _Outcome) -> _Outcome:
        self._outcomes[_key(update)] = outcome
        return outcome

    async def _outputs(self, update: Obj, result: pb.OperationResult) -> str | None:
        """Create the outputs Secret (directly, never cached) when there are outputs; its name."""
        if not result.outputs and not (
            result.type == pb.OperationType.UP and result.state == pb.OperationState.SUCCEEDED
        ):
            return None
        secret = us.outputs_secret(update, result.outputs)
        try:
            await self._secrets.create(secret)
        except ApiException as exc:
            if api_error_status(exc) != 409:  # AlreadyExists: an earlier attempt created it
                raise
        return str(secret["metadata"]["name"])

    async def _write_result(self, update: Obj, result: pb.OperationResult) -> None:
        """The result's outputs Secret, the final status (preconditioned), then its Event."""
        key, uid = _key(update), _uid(update)
        outputs = await self._outputs(update, result)
        await self._apply_status(update, us.result_status(update, result, outputs))
        utype = (update.get("spec") or {}).get("type") or "update"
        reason = us.failed_reason(result)
        log = _log.bind(update=key, operation=uid, type=utype, reason=reason)
        if result.state == pb.OperationState.SUCCEEDED:
            log.info("update succeeded")
            self.events.event(update, "Normal", "UpdateSucceeded", f"{utype} succeeded")
        else:
            message = us.result_message(result)
            log.info("update failed", message=message)
            first = message.splitlines()[0] if message else reason
            self.events.event(update, "Warning", "UpdateFailed", f"{utype} failed ({reason}): {first}")

    async def _write_end(self, update: Obj, reason: str, message: str) -> None:
        await self._apply_status(update, us.ended_status(update, reason, message))
        _log.info("update ended", update=_key(update), reason=reason, message=message)
        self.events.event(update, "Warning", "UpdateFailed", f"{reason}: {message}")

    # --- completed Updates ------------------------------------------------------------------------

    def _stack_recorded(self, update: Obj) -> bool:
        """The Stack that created ``update`` has recorded it (or there is no such Stack any more)."""
        stack_name = _stack_owner(update)
        if stack_name is None:
            return True
        meta = update.get("metadata") or {}
        stack = self.stacks.indexer.get_by_key(object_key(meta.get("namespace"), stack_name))
        return stack is None or _last_update_name(stack) == meta.get("name")

    async def _completed(self, update: Obj) -> Result:
        meta = update.get("metadata") or {}
        recorded = self._stack_recorded(update)
        if meta.get("deletionTimestamp"):
            if has_finalizer(update, STACK_FINALIZER):
                if not recorded:
                    return Result.requeue_after(STACK_RECORD_RECHECK)
                await remove_finalizer(self._update_client, update, STACK_FINALIZER)
            return Result.done()
        ttl_text = (update.get("spec") or {}).get("ttlAfterCompleted")
        if not ttl_text:
            return Result.done()
        try:
            ttl = parse_go_duration(str(ttl_text))
        except ValueError:
            return Result.done()
        status = update.get("status") or {}
        complete = get_condition(status.get("conditions"), CONDITION_COMPLETE) or {}
        ended = _parse_time(status.get("endTime")) or _parse_time(complete.get("lastTransitionTime"))
        if ended is None:
            return Result.done()
        remaining = (ended + ttl - datetime.now(UTC)).total_seconds()
        if remaining > 0:
            return Result.requeue_after(remaining)
        if not recorded:
            return Result.requeue_after(STACK_RECORD_RECHECK)
        try:
            await self._update_client.delete(
                str(meta["name"]), meta.get("namespace"), uid=_uid(update), propagation_policy="Background"
            )
        except ApiException as exc:
            if api_error_status(exc) not in (404, 409):
                raise
            return Result.done()
        _log.info("update expired", update=_key(update), ttl=str(ttl_text))
        self.events.event(update, "Normal", "UpdateExpired", "ttl expired and was deleted")
        return Result.done()


def setup(manager: Manager, options: ControllerOptions | None = None, **kwargs: Any) -> UpdateReconciler:
    """Declare the update controller and its watch-task runnable on ``manager``."""
    reconciler = UpdateReconciler(manager, options, **kwargs)
    (
        manager.controller(CONTROLLER_NAME, reconciler)
        .for_(
            UPDATES,
            predicate=or_(
                generation_changed,
                owner_references_changed,
                deletion_started,
                condition_became(CONDITION_COMPLETE, "True"),
            ),
        )
        # A Workspace becoming Ready wakes the Updates waiting for it.
        .watches_by_index(
            WORKSPACES,
            WORKSPACE_INDEX,
            index_by_field("spec.workspaceName", namespaced=True),
            predicate=condition_became("Ready", "True"),
        )
        # A Stack recording an Update lets that Update expire (TTL) or drop the Stack's finalizer.
        .watches(STACKS, _stack_last_update_keys, predicate=_stack_last_update_changed)
        # A watch task's operation ended: its outcome waits for the reconcile to write it.
        .watches_channel(reconciler.wake)
    )
    manager.add_runnable("update-watches", reconciler.watches.run, leader_only=True)
    return reconciler
