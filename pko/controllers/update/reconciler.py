"""The Update reconciler: run one Pulumi operation through the workspace agent and record its result.

The Go operator's update controller, with operations owned by the agent:

* An Update waits for its Workspace to be Ready (``WorkspaceNotFound``/``WorkspaceNotReady``; the
  Workspace watch wakes it, no polling), then selects the stack (every time: the selection lives
  in the agent's memory) and calls ``StartOperation`` with the Update's uid as the operation id.
  Starting the same id again attaches, so a retried reconcile never runs an operation twice.
* The reconcile returns once the operation runs; a task per running Update (``watch.py``) follows
  ``WatchOperation`` and, when the operation ends, hands its outcome to the reconcile (a
  :class:`~pko.machinery.source.KeyChannel`). A Progressing Update with no local task (an
  operator restart, a new leader) gets one: ``GetOperation`` first, then the watch.
* The reconcile is the one writer of an Update's status. The result is recorded once: the write
  carries the resourceVersion it was computed from, so a write from a stale read gets 409 and the
  outcome is kept and written again from a fresh read; a recorded result is never rewritten.
* No Update stays Progressing forever: an agent that no longer knows the operation (pod replaced),
  or another operator's agent (UNIMPLEMENTED: the Go operator's, still in the pod after a switch),
  ends it ``OperationLost`` at once; the agent's own results say ``AgentRestarted``/``Terminated``; an agent
  unreachable beyond a budget ends it ``AgentUnreachable``. A Workspace whose readiness flaps does
  not fail a running Update (upstream PR 1155): only the agent's answers do.
* A completed Update is deleted after ``ttlAfterCompleted``, never before the Stack that created it
  recorded it; a deleting, completed, recorded Update loses the Stack's finalizer (upstream 1060).

Each reconcile plans, then acts: ``_observe`` reads (the caches and the reconciler's memory: the
pending outcome, whether a watch task runs), :func:`~pko.controllers.update.plan.decide` (pure, in
``plan.py``) computes the status to write, the ordered writes and the ``Result``, and ``_act`` is
the one place that carries them out (status writes, agent calls, the outputs Secret, finalizer,
delete, Events, the outcome bookkeeping). A write's expected failure (the agent unreachable or
busy, a stale status write) goes back to the pure ``refused``, which plans the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from datetime import UTC, datetime
from typing import Any, Final

import structlog

from pko.agentclient import AgentClient, AgentError, audience, resolve_address
from pko.api.generated.pko.agent import v1 as pb
from pko.api.update import CONDITION_COMPLETE
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import (
    FIELD_MANAGER_STACK_FINALIZER,
    FIELD_MANAGER_UPDATE_STATUS,
    STACK_FINALIZER,
    STACK_NAME_LABEL,
    STACKS,
    UPDATES,
    UPDATES_BY_WORKSPACE,
    WORKSPACE_SELECTOR,
    WORKSPACES,
    index_updates_by_workspace,
)
from pko.controllers.secretaccess import SecretAccess
from pko.controllers.update import status as us
from pko.controllers.update.plan import (
    CancelGone,
    CancelOperation,
    CreateOutputs,
    DeleteUpdate,
    Emit,
    Failure,
    Follow,
    ForgetOutcome,
    KeepOutcome,
    Log,
    Observed,
    Outcome,
    Plan,
    RemoveFinalizer,
    SelectAndStart,
    StopFollowing,
    Write,
    WriteStatus,
    decide,
    key_of,
    last_update_name,
    refused,
    stack_owner,
    stack_recorded,
    uid_of,
    watch_ended,
)
from pko.controllers.update.watch import UpdateWatches
from pko.machinery.controller import Result
from pko.machinery.events import Recorder
from pko.machinery.executor import Expected, execute
from pko.machinery.kubeclient import ApiException
from pko.machinery.manager import Manager
from pko.machinery.objects import remove_finalizer
from pko.machinery.predicates import (
    condition_became,
    deletion_started,
    generation_changed,
    or_,
    owner_references_changed,
)
from pko.machinery.resource import PODS, SECRETS, Obj, api_error_status
from pko.machinery.source import KeyChannel
from pko.machinery.store import index_by_field, object_key
from pko.machinery.writes import StatusWriter
from pko.tokens import TokenSource

__all__ = ["WORKSPACE_INDEX", "UpdateReconciler", "setup"]

CONTROLLER_NAME: Final = "update-controller"
WORKSPACE_INDEX: Final = UPDATES_BY_WORKSPACE

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


# The failures each write expects (``refused`` plans what follows them); any other propagates.
_EXPECTED: Final[Expected] = {
    SelectAndStart: (_Unreachable, AgentError),
    CancelOperation: (_Unreachable, AgentError),
    WriteStatus: (ApiException,),
    CreateOutputs: (ApiException,),
    DeleteUpdate: (ApiException,),
}


def _failure(exc: BaseException) -> Failure:
    """An expected failure as the pure planner sees it."""
    if isinstance(exc, _Unreachable):
        return Failure(message=str(exc), unreachable=True)
    if isinstance(exc, AgentError):
        return Failure(code=exc.code, reason=exc.reason, message=exc.message, transient=exc.transient)
    if isinstance(exc, ApiException):
        return Failure(status=api_error_status(exc), message=str(exc.reason or ""))
    return Failure(message=str(exc))


def _stack_last_update_keys(stack: Obj) -> list[str]:
    name = last_update_name(stack)
    return [object_key((stack.get("metadata") or {}).get("namespace"), name)] if name else []


def _stack_last_update_changed(old: Obj | None, new: Obj | None) -> bool:
    if old is None or new is None:
        return new is not None
    return last_update_name(old) != last_update_name(new)


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
        # Who the operator is and the role to bind: a refused outputs Secret's message.
        self.access = SecretAccess.of(options)
        self.api = manager.api
        self.updates = manager.informer(UPDATES, indexers={WORKSPACE_INDEX: index_updates_by_workspace})
        self.workspaces = manager.informer(WORKSPACES)
        self.stacks = manager.informer(STACKS)
        self.pods = manager.informer(PODS, label_selector=WORKSPACE_SELECTOR)
        self.tokens = tokens or options.operator_tokens(manager)
        self.events: Recorder = events if events is not None else manager.events
        self.watches = UpdateWatches()
        # Outcomes of ended operations not yet written (the reconcile writes them), by key.
        self._outcomes: dict[str, Outcome] = {}
        self.wake = KeyChannel()
        self.lost_agent_budget = options.agent_unreachable_timeout
        self.connect_timeout = connect_timeout
        self._update_client = manager.client(UPDATES)
        self.status_writer = StatusWriter(
            self.updates,
            FIELD_MANAGER_UPDATE_STATUS,
            us.STATUS_FIELDS,
            client=self._update_client,
            force=True,
        )
        self._secrets = manager.client(SECRETS)
        self._engine_level = _LEVELS.get(options.engine_event_log_level.strip().lower(), logging.DEBUG)

    # --- reconcile -------------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        observed = self._observe(key)
        return await self._act(observed, decide(observed))

    def _observe(self, key: str) -> Observed:
        """What this reconcile decides from: the caches and the reconciler's own memory (no I/O)."""
        now = datetime.now(UTC)
        update = self.updates.latest(key)
        if update is None:
            return Observed(key, None, now, last=self.watches.info(key))
        meta = update.get("metadata") or {}
        namespace = meta.get("namespace")
        ws_name = (update.get("spec") or {}).get("workspaceName")
        workspace = (
            self.workspaces.indexer.get_by_key(object_key(namespace, str(ws_name))) if ws_name else None
        )
        owner = stack_owner(update)
        stack = self.stacks.indexer.get_by_key(object_key(namespace, owner)) if owner is not None else None
        spec = update.get("spec") or {}
        plan_name = spec.get("plan") if spec.get("type") == "up" else None
        plan_source = (
            self.updates.indexer.get_by_key(object_key(namespace, str(plan_name))) if plan_name else None
        )
        return Observed(
            key,
            update,
            now,
            workspace=workspace,
            outcome=self._outcomes.get(key),
            stack_recorded=stack_recorded(update, stack),
            watch_running=self.watches.running(key, uid_of(update)),
            plan_source=plan_source,
            access=self.access,
        )

    # --- acting: the one place an Update reconcile writes ----------------------------------------

    async def _act(self, observed: Observed, plan: Plan) -> Result:
        """Carry out ``plan`` (:func:`~pko.machinery.executor.execute`): its writes in order, then
        what ``then`` plans from the agent's answer. A write's expected failure (``_EXPECTED``) is
        handed to :func:`refused`, which plans the rest; any other failure propagates (the
        controller retries with backoff)."""

        def planned_from(_plan: Plan, write: Write, failure: Failure) -> Plan | None:
            return refused(observed, write, failure, datetime.now(UTC))

        def follow(plan: Plan, answer: pb.OperationStatus | None) -> Plan | None:
            return (
                plan.then(answer, datetime.now(UTC)) if plan.then is not None and answer is not None else None
            )

        done = await execute(
            plan,
            functools.partial(self._write, observed),
            expected=_EXPECTED,
            failure_of=_failure,
            refused=planned_from,
            follow=follow,
        )
        return done.result

    async def _write(self, observed: Observed, write: Write) -> pb.OperationStatus | None:
        """Carry out one write; the agent's answer for the writes that call it."""
        key, update = observed.key, observed.update
        if isinstance(write, KeepOutcome):
            self._outcomes[key] = write.outcome
        elif isinstance(write, ForgetOutcome):
            self._outcomes.pop(key, None)
            if write.uid is not None:
                self.watches.forget(write.uid)
        elif isinstance(write, StopFollowing):
            self.watches.cancel(key)
        elif isinstance(write, CancelGone):
            await self._cancel_gone(write.last)
        elif isinstance(write, Log):
            _log.info(write.event, **write.fields)
        else:
            if update is None:
                raise TypeError(f"{type(write).__name__} needs the Update")
            if isinstance(write, WriteStatus):
                # Preconditioned on the resourceVersion read: a write from a stale read fails (409),
                # which is what makes recording a result happen once.
                await self.status_writer.write(update, write.status, precondition=True)
            elif isinstance(write, SelectAndStart):
                async with self._agent(update) as client:
                    await client.select_stack(
                        write.stack_name, create=write.create, secrets_provider=None, summary=False
                    )
                    return await client.start_operation(write.request)
            elif isinstance(write, CancelOperation):
                async with self._agent(update) as client:
                    return await client.cancel_operation(uid_of(update))
            elif isinstance(write, Follow):
                self._follow_in_background(update)
            elif isinstance(write, CreateOutputs):
                await self._create_outputs(write.secret)
            elif isinstance(write, Emit):
                self.events.event(update, write.type, write.reason, write.message)
            elif isinstance(write, RemoveFinalizer):
                await remove_finalizer(
                    self._update_client, update, STACK_FINALIZER, field_manager=FIELD_MANAGER_STACK_FINALIZER
                )
            elif isinstance(write, DeleteUpdate):
                meta = update.get("metadata") or {}
                await self._update_client.delete(
                    str(meta["name"]),
                    meta.get("namespace"),
                    uid=uid_of(update),
                    propagation_policy="Background",
                )
        return None

    async def _cancel_gone(self, last: Obj) -> None:
        """Cancel a vanished Update's operation, best effort."""
        with contextlib.suppress(AgentError, _Unreachable, TimeoutError):
            async with asyncio.timeout(self.connect_timeout):
                async with self._agent(last) as client:
                    await client.cancel_operation(uid_of(last))

    async def _create_outputs(self, secret: Obj) -> None:
        """Create the outputs Secret (directly, never cached)."""
        try:
            await self._secrets.create(secret)
        except ApiException as exc:
            if api_error_status(exc) != 409:  # AlreadyExists: an earlier attempt created it
                raise

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
        key, uid = key_of(update), uid_of(update)
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
            if update is None or uid_of(update) != uid or us.is_complete(update):
                return
            engine_log = self._engine_logger(update)
            try:
                async with self._agent(update) as client:
                    status = await client.get_operation(uid)
                    if status.result is not None:
                        self._conclude(key, Outcome(uid, result=status.result))
                        return
                    lost_since, failures = None, 0
                    start = self.watches.last_sequence(uid) + 1
                    async for event in client.watch_operation(uid, from_sequence=start):
                        if event.result is not None:
                            self._conclude(key, Outcome(uid, result=event.result))
                            return
                        if event.engine_event_data is not None and event.sequence >= start:
                            engine = (
                                event.engine_event if engine_log.is_enabled_for(self._engine_level) else None
                            )
                            if engine is not None:  # decoded only to be logged
                                engine_log.log(
                                    self._engine_level,
                                    "engine event",
                                    engine_event=engine.to_dict(),
                                    sequence=event.sequence,
                                )
                            self.watches.set_sequence(uid, event.sequence)
                last_error = "the agent ended the watch without a result"
            except AgentError as exc:
                ended = watch_ended(uid, exc.code, exc.message)
                if ended is not None:
                    self._conclude(key, ended)
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
                self._conclude(key, Outcome(uid, reason=us.REASON_UNREACHABLE, message=message))
                return
            _log.info("update watch interrupted; retrying", update=key, error=last_error, attempt=failures)
            delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.8, 1.2)
            await asyncio.sleep(min(delay, max(0.1, lost_since + self.lost_agent_budget - now)))

    # --- recording --------------------------------------------------------------------------------

    def _conclude(self, key: str, outcome: Outcome) -> None:
        """A watch task's last act: hand the outcome to the reconcile, the one writer."""
        self._outcomes[key] = outcome
        self.wake.send(key)


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
