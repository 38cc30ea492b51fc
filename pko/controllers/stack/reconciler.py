"""The Stack reconciler: keeps a Pulumi stack up to date from a git repo, a Flux source or a Program.

One reconcile follows the Go operator's ``StackReconciler.Reconcile``:

1. record the result of ``status.currentUpdate`` once its Update completes (outputs from the
   Update's Secret, ``[secret]`` for secret keys); a ``currentUpdate`` whose Update is gone is
   detected (a direct read confirms the cache) and counted as a transient failure, so the Stack
   moves on instead of waiting forever (Go operator issue 1292);
2. resolve the source to a revision: a commit, a branch head (``ls-remote``, shared between
   Stacks, :mod:`pko.controllers.stack.branchpoll`), a Flux object's or Program's artifact; or, to destroy
   a Stack whose source is gone, ``status.projectInfo``;
3. decide whether to run (:func:`pko.controllers.stack.status.plan_sync`); if not, report the
   result (Ready / retrying / Stalled) and requeue for the next resync, poll or retry;
4. check prerequisites, apply the Workspace (server-side apply), and when it is ready create one
   Update (never two: ``currentUpdate`` guards it).

Each reconcile plans, then acts, as controller-runtime's reconcilers read: ``_plan`` reads (the
caches, Secrets, the git remote: :mod:`pko.controllers.stack.sources`) and decides with pure
functions (:mod:`pko.controllers.stack.status`, :mod:`pko.controllers.stack.plan`) the Stack's
status, the ordered writes and the ``Result``; ``_act`` is the one place that writes, and the one
place the Stack's status is written (:class:`~pko.machinery.writes.StatusWriter`: skipped when
nothing changed, so an idle Stack costs no writes). The Workspace is applied only when its digest
changed (:class:`~pko.machinery.writes.DigestApplier`). Deletion with ``destroyOnFinalize`` runs a
destroy and removes the finalizer only after a destroy that succeeded for this deletion.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import structlog
from kubernetes_asyncio.client.exceptions import ApiException

from pko.api.meta import parse_go_duration
from pko.api.stack import Stack
from pko.api.validation import deprecation_warnings, format_errors, parse_stack
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import (
    FIELD_MANAGER,
    FIELD_MANAGER_PREREQUISITE,
    FIELD_MANAGER_STACK_FINALIZER,
    FIELD_MANAGER_STACK_STATUS,
    PROGRAMS,
    RECONCILIATION_REQUEST_ANNOTATION,
    STACK_FINALIZER,
    STACKS,
    UPDATES,
    WORKSPACES,
)
from pko.controllers.stack.backend import EPHEMERAL_BACKEND_REASON, ephemeral_backend
from pko.controllers.stack.branchpoll import BranchResolver
from pko.controllers.stack.plan import (
    AddFinalizer,
    ApplyWorkspace,
    CreateUpdate,
    DeleteWorkspace,
    Emit,
    Plan,
    PruneHistory,
    ReleaseUpdate,
    RemoveFinalizer,
    RequestReconcile,
    Write,
    WriteStatus,
    plan_synced,
    plan_update,
    write_status,
)
from pko.controllers.stack.retry import RetrySettings
from pko.controllers.stack.sources import SOURCE_UNAVAILABLE_REQUEUE, SourceResolver, Stall, saved_project
from pko.controllers.stack.status import (
    MSG_UPDATE,
    MSG_WORKSPACE,
    StackRef,
    destroy_from_project_message,
    destroyed_nothing,
    mark_ephemeral_backend,
    mark_ready,
    mark_reconciling,
    mark_result,
    mark_stalled,
    mark_suspended,
    outputs_from_secret,
    plan_sync,
    reconcile_request,
    record_destroyed_nothing,
    record_failed,
    record_lost,
    record_succeeded,
    release_command,
    requirement_error,
    utcnow,
)
from pko.controllers.stack.watches import (
    FLUX_SOURCES,
    INDEX_FLUX,
    INDEX_PREREQUISITE,
    INDEX_PROGRAM,
    INDEX_UPDATES_BY_STACK,
    STACK_PREDICATE,
    StackMetrics,
    artifact_predicate,
    flux_key,
    index_flux,
    index_prerequisites,
    index_program,
    index_updates_by_stack,
    metadata_of,
    namespace_of,
    stack_became_ready,
    update_complete,
    update_predicate,
    workspace_predicate,
    workspace_ready,
    workspace_stalled,
)
from pko.controllers.stack.workspaceobject import ResolvedSource, build_workspace
from pko.machinery.conditions import is_true
from pko.machinery.controller import Result
from pko.machinery.manager import Manager
from pko.machinery.objects import add_finalizer, has_finalizer, remove_finalizer
from pko.machinery.resource import SECRETS, Obj, Resource, ResourceClient, api_error_status
from pko.machinery.store import DeletedFinalStateUnknown, object_key
from pko.machinery.writes import DigestApplier, StatusWriter, stamp

__all__ = [
    "CONTROLLER_NAME",
    "FLUX_SOURCES",
    "StackReconciler",
    "setup",
]

CONTROLLER_NAME: Final = "stack-controller"
# Secrets are not watched (never cached cluster-wide): a missing one is looked for again this often,
# so creating it later un-stalls the Stack without a spec change.
SECRET_RECHECK: Final = 120.0
HISTORY_LIMIT: Final = 5
"""Completed Updates kept per Stack (their outputs Secrets go with them): no pile-up (Go issue 1163)."""
DEPRECATED_FIELD_REASON: Final = "DeprecatedField"  # a pko Event: upstream only documents the deprecations

_log = structlog.get_logger("pko.controllers.stack.reconciler")

# --- the reconciler --------------------------------------------------------------------------


# The status fields this controller owns.
OWNED_STATUS: Final = (
    "observedGeneration",
    "observedReconcileRequest",
    "conditions",
    "outputs",
    "lastUpdate",
    "currentUpdate",
    "projectInfo",
    "nextRetryTime",
    "lastFailure",
    "resourceCount",
)


class StackReconciler:
    """Reconciles ``pulumi.com/v1`` Stacks (see the module docstring)."""

    def __init__(
        self,
        manager: Manager,
        options: ControllerOptions | None = None,
        *,
        retry: RetrySettings | None = None,
        branches: BranchResolver | None = None,
        history_limit: int = HISTORY_LIMIT,
        secret_recheck: float = SECRET_RECHECK,
    ) -> None:
        self.manager = manager
        self.options = options or ControllerOptions()
        self.retry = retry or self.options.retry
        self.branches = branches or BranchResolver()
        self.history_limit = history_limit
        self.secret_recheck = secret_recheck
        self.stacks = manager.informer(
            STACKS,
            indexers={
                INDEX_PROGRAM: index_program,
                INDEX_PREREQUISITE: index_prerequisites,
                INDEX_FLUX: index_flux,
            },
        )
        self.workspaces = manager.informer(WORKSPACES)
        self.updates = manager.informer(UPDATES, indexers={INDEX_UPDATES_BY_STACK: index_updates_by_stack})
        self.programs = manager.informer(PROGRAMS)
        api = manager.api
        self._stack_client = ResourceClient(api, STACKS)
        self._update_client = ResourceClient(api, UPDATES)
        self._secrets = ResourceClient(api, SECRETS)
        self.status_writer = StatusWriter(
            self.stacks, FIELD_MANAGER_STACK_STATUS, OWNED_STATUS, client=self._stack_client
        )
        self.workspace_applier = DigestApplier(
            self.workspaces, FIELD_MANAGER, client=ResourceClient(api, WORKSPACES)
        )
        self.sources = SourceResolver(manager, self.programs, self._secrets, self.branches, secret_recheck)
        self.events = manager.events
        self.metrics = StackMetrics(manager)

    # --- entry point -------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        obj = self.stacks.latest(key)
        if obj is None:
            self.workspace_applier.forget(key)  # its Workspace (same name) goes with it
            return Result.done()
        plan = await self._plan(obj)
        try:
            workspace = await self._act(obj, plan.writes)
            if plan.then is not None and workspace is not None:
                plan = plan.then(workspace)
                await self._act(obj, plan.writes)
        except Stall as stall:
            generation = int(metadata_of(obj).get("generation") or 0)
            mark_stalled(plan.status, stall.reason, stall.message, generation, utcnow())
            await self._act(obj, [write_status(plan.status)])
            return Result.requeue_after(stall.requeue) if stall.requeue else Result.done()
        return plan.result

    # --- deciding (reads only) ---------------------------------------------------------------

    async def _plan(self, obj: Obj) -> Plan:
        """What this reconcile writes, from the Stack as read and what it refers to."""
        meta = metadata_of(obj)
        deleting = bool(meta.get("deletionTimestamp"))
        if deleting and not has_finalizer(obj, STACK_FINALIZER):
            return Plan([], Result.done())
        writes: list[Write] = []
        if not deleting and not has_finalizer(obj, STACK_FINALIZER):
            writes.append(AddFinalizer())
        now = utcnow()
        generation = int(meta.get("generation") or 0)
        status: Obj = {k: v for k, v in (obj.get("status") or {}).items() if k in OWNED_STATUS}
        status["observedGeneration"] = generation
        status["observedReconcileRequest"] = reconcile_request(obj)
        stack, errors = parse_stack(obj)
        if stack is None or errors:
            if deleting and not (obj.get("status") or {}).get("lastUpdate"):
                return Plan([*writes, RemoveFinalizer()], Result.done(), status)
            message = format_errors(errors)
            mark_stalled(status, "SpecInvalid", message, generation, now)
            writes += [Emit("Warning", "StackConfigInvalid", message), write_status(status)]
            return Plan(writes, Result.done(), status)
        ephemeral = ephemeral_backend(stack)
        mark_ephemeral_backend(status, ephemeral, generation, now)
        if int((obj.get("status") or {}).get("observedGeneration") or 0) != generation:
            # Once per generation (the recorder folds repeats of a retried reconcile into one Event).
            writes += [Emit("Warning", DEPRECATED_FIELD_REASON, w) for w in deprecation_warnings(stack.spec)]
            if ephemeral is not None and not deleting:
                writes.append(Emit("Warning", EPHEMERAL_BACKEND_REASON, ephemeral))
        try:
            return await self._plan_stack(obj, stack, status, now, writes)
        except Stall as stall:
            mark_stalled(status, stall.reason, stall.message, generation, now)
            return Plan([*writes, write_status(status)], _after(stall.requeue), status)

    async def _plan_stack(
        self, obj: Obj, stack: Stack, status: Obj, now: datetime, writes: list[Write]
    ) -> Plan:
        meta = metadata_of(obj)
        generation = int(meta.get("generation") or 0)
        deleting = bool(meta.get("deletionTimestamp"))
        spec = stack.spec
        recorded: Obj | None = None

        # 1. absorb the result of the Update in flight
        current = status.get("currentUpdate")
        if current:
            update = await self._current_update(obj, str(current.get("name")))
            if update is None:
                _log.info(
                    "current update is gone; moving on", stack=meta.get("name"), update=current.get("name")
                )
                record_lost(status, current, now)
                status.pop("currentUpdate", None)
            elif not update_complete(update):
                mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
                return Plan([*writes, write_status(status)], Result.done(), status)
            else:
                writes += await self._record(status, current, update, now)
                status.pop("currentUpdate", None)
                recorded = update

        # nothing to destroy: release the Stack (its Workspace and Updates go with it)
        if deleting and (not spec.destroy_on_finalize or spec.preview):
            mark_ready(status, generation, now)
            return Plan([*writes, write_status(status, recorded), RemoveFinalizer()], Result.done(), status)

        # 2. the source, pinned to a revision; a destroy runs in the workspace pod that holds the
        # stack whenever there is one (never changed for the destroy's sake: a pod replaced
        # loses state kept on its own disk)
        kept = self._workspace_for_destroy(obj) if deleting else None
        source: ResolvedSource | None = None
        note: str | None = None
        if kept is not None:
            commit = str((status.get("lastUpdate") or {}).get("lastAttemptedCommit") or "")
        else:
            try:
                source, commit = await self.sources.resolve(obj, stack)
            except Stall as stall:
                saved = saved_project(stack, status) if deleting else None
                if saved is None:
                    mark_stalled(status, stall.reason, stall.message, generation, now)
                    return Plan([*writes, write_status(status, recorded)], _after(stall.requeue), status)
                source, commit, note = saved, "", destroy_from_project_message(stall.message, saved)

        # 3. run, or report and wait
        polls_branch = bool(spec.project_repo and spec.branch)
        decision = plan_sync(obj, spec, status, commit, now, self.retry, polls_branch=polls_branch)
        mark_suspended(status, spec.suspend and not deleting, generation, now)
        if decision.synced:
            mark_result(status, spec, self.retry, generation, now, stack=_ref(obj))
            mark_suspended(status, spec.suspend and not deleting, generation, now)
            plan = plan_synced(stack, status, decision.requeue_after, recorded, deleting=deleting)
            return Plan([*writes, *plan.writes], plan.result, status)
        if spec.suspend and not deleting:
            return Plan([*writes, write_status(status, recorded)], Result.done(), status)

        # 4. prerequisites (not when deleting: a missing prerequisite must not block deletion)
        if not deleting:
            unmet, requests = self._prerequisites(obj, stack, now)
            writes += requests
            if unmet is not None:
                mark_reconciling(status, "PrerequisiteNotSatisfied", unmet, generation, now)
                return Plan([*writes, write_status(status, recorded)], Result.done(), status)

        # 5. the Workspace, then (once it is ready) 6. one Update
        def then(workspace: Obj) -> Plan:
            return plan_update(
                obj,
                stack,
                status,
                workspace,
                message=decision.message,
                commit=commit,
                now=now,
                created=datetime.now(UTC),
                deleting=deleting,
            )

        mark_reconciling(status, "StackProcessing", note or MSG_WORKSPACE, generation, now)
        if note is not None:
            writes.append(Emit("Warning", "DestroyFromProjectInfo", note))
        if kept is not None:
            writes.append(write_status(status, recorded))
            plan = then(kept)
            return Plan([*writes, *plan.writes], plan.result, status)
        try:
            body = self._workspace_body(stack, source, deleting=deleting)
        except Stall as stall:
            mark_stalled(status, stall.reason, stall.message, generation, now)
            return Plan([*writes, write_status(status, recorded)], _after(stall.requeue), status)
        writes += [write_status(status, recorded), ApplyWorkspace(body)]
        return Plan(writes, Result.done(), status, then)

    def _workspace_for_destroy(self, obj: Obj) -> Obj | None:
        """The Workspace a destroy runs in as it is: the one that exists, unless it is Stalled (its
        pod cannot serve; rebuilt from the source, or from ``projectInfo`` when the source is gone)
        or going away. Not Ready yet: the destroy waits for it (its status change wakes us)."""
        workspace = self.workspaces.indexer.get_by_key(
            object_key(namespace_of(obj), str(metadata_of(obj)["name"]))
        )
        if workspace is None or metadata_of(workspace).get("deletionTimestamp"):
            return None
        if workspace_stalled(workspace) and not workspace_ready(workspace):
            return None
        return workspace

    async def _current_update(self, obj: Obj, name: str) -> Obj | None:
        """The Update in flight; None when it no longer exists (checked against the API)."""
        cached = self.updates.indexer.get_by_key(object_key(namespace_of(obj), name))
        if cached is not None:
            return cached
        return await self._update_client.get_or_none(name, namespace_of(obj))

    async def _record(self, status: Obj, current: Obj, update: Obj, now: datetime) -> list[Write]:
        """Record a completed Update's result in ``status``; the Event that says so."""
        conditions = (update.get("status") or {}).get("conditions")
        if is_true(conditions, "Failed"):
            record_failed(status, current, update, now)
            message = (update.get("status") or {}).get("message") or ""
            return [Emit("Warning", "StackUpdateFailure", f"Failed to update stack: {message}")]
        nothing = destroyed_nothing(status, update)
        if nothing is not None:
            record_destroyed_nothing(status, current, update, nothing, now)
            return [Emit("Warning", "StackUpdateFailure", f"Failed to destroy stack: {nothing}")]
        outputs: Obj | None = None
        secret_name = (update.get("status") or {}).get("outputs")
        if secret_name:
            secret = await self._secrets.get_or_none(str(secret_name), namespace_of(update))
            if secret is not None:
                outputs = outputs_from_secret(secret)
        record_succeeded(status, current, update, outputs, now)
        return [Emit("Normal", "StackCreated", "Successfully updated stack")]

    def _prerequisites(self, obj: Obj, stack: Stack, now: datetime) -> tuple[str | None, list[Write]]:
        """None when every prerequisite is satisfied, else the message (Go's wording); and the
        prerequisites to ask to run again."""
        failed: list[str] = []
        message: str | None = None
        requests: list[Write] = []
        for prereq in stack.spec.prerequisites or []:
            other = self.stacks.indexer.get_by_key(object_key(namespace_of(obj), prereq.name))
            if other is None:
                failed.append(prereq.name)
                message = (
                    f'unable to fetch prerequisite "{prereq.name}": '
                    + f'stacks.pulumi.com "{prereq.name}" not found'
                )
                continue
            within_text = prereq.requirement.succeeded_within_duration if prereq.requirement else None
            within: timedelta | None = parse_go_duration(within_text) if within_text else None
            error = requirement_error(other, within, now)
            if error is None:
                continue
            failed.append(prereq.name)
            message = f'prerequisite not satisfied for "{prereq.name}": {error.message}'
            if error.touch and reconcile_request(other) != error.touch:
                requests.append(RequestReconcile(prereq.name, error.touch))
        if len(failed) > 1:
            message = f"multiple prerequisites were not satisfied {', '.join(failed)}"
        return message, requests

    def _workspace_body(self, stack: Stack, source: ResolvedSource | None, *, deleting: bool) -> Obj:
        """The Workspace to apply, stamped with its digest."""
        try:
            body = build_workspace(stack, source, deleting=deleting)
        except ValueError as exc:
            raise Stall("SpecInvalid", str(exc)) from exc
        spec = body["spec"]
        if not spec.get("image"):
            # Named on the Workspace (as upstream's workspaces show it): `kubectl get workspace`
            # then says which image runs, and a new operator default rolls the pod visibly.
            spec["image"] = self.options.workspace_image(spec.get("securityProfile"))
        return stamp(body)

    # --- acting: the one place a Stack reconcile writes ------------------------------------

    async def _act(self, obj: Obj, writes: list[Write]) -> Obj | None:
        """Carry out ``writes`` in order; the Workspace, when one was applied."""
        workspace: Obj | None = None
        for write in writes:
            if isinstance(write, WriteStatus):
                await self._write_status(obj, write.status)
                await self._release_update(write.recorded)
            elif isinstance(write, AddFinalizer):
                written = self.stacks.wrote(await add_finalizer(self._stack_client, obj, STACK_FINALIZER))
                obj["metadata"] = written.get("metadata") or obj.get("metadata")
            elif isinstance(write, RemoveFinalizer):
                self.stacks.wrote(await remove_finalizer(self._stack_client, obj, STACK_FINALIZER))
            elif isinstance(write, Emit):
                self.events.event(obj, write.type, write.reason, write.message)
            elif isinstance(write, ApplyWorkspace):
                workspace = await self._apply_workspace(obj, write.body)
            elif isinstance(write, CreateUpdate):
                await self._create_update(obj, write.body)
            elif isinstance(write, DeleteWorkspace):
                if await self._delete_workspace(obj):
                    self.events.event(
                        obj, "Normal", "WorkspaceDeleted", "Workspace deleted per reclaim policy"
                    )
            elif isinstance(write, ReleaseUpdate):
                await self._release_update(write.update)
            elif isinstance(write, PruneHistory):
                await self._prune_history(obj, write.keep)
            elif isinstance(write, RequestReconcile):
                await self._request_reconcile(namespace_of(obj), write.stack, write.request)
        return workspace

    async def _write_status(self, obj: Obj, status: Obj) -> None:
        """Apply the status this controller owns (skipped when unchanged); ``obj`` then holds it."""
        written = await self.status_writer.write(obj, status)
        if written is not None:
            self.metrics.observe(written)
            # Later writes in this reconcile compare with what is now stored.
            obj["metadata"] = written.get("metadata") or obj.get("metadata")
            obj["status"] = written.get("status") or {}

    async def _apply_workspace(self, obj: Obj, body: Obj) -> Obj:
        try:
            workspace, _ = await self.workspace_applier.ensure(body)
        except ApiException as exc:
            if metadata_of(obj).get("deletionTimestamp") and _namespace_terminating(exc):
                message = _terminating_message(obj, obj.get("status") or {})
                raise Stall("NamespaceTerminating", message, SOURCE_UNAVAILABLE_REQUEUE) from exc
            raise
        return workspace

    async def _create_update(self, obj: Obj, body: Obj) -> None:
        try:
            # The Update carries the Stack's finalizer from birth: its manager is upstream's name for it.
            await self._update_client.create(body, field_manager=FIELD_MANAGER_STACK_FINALIZER)
        except ApiException as exc:
            if api_error_status(exc) != 409:  # 409: it exists, so it is ours and in flight
                # Not created: `currentUpdate` must not name it (the next reconcile starts one).
                status = {k: v for k, v in (obj.get("status") or {}).items() if k in OWNED_STATUS}
                status.pop("currentUpdate", None)
                await self._write_status(obj, status)
            raise

    async def _request_reconcile(self, namespace: str | None, name: str, request: str) -> None:
        await self._stack_client.apply(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "annotations": {RECONCILIATION_REQUEST_ANNOTATION: request},
                },
            },
            field_manager=FIELD_MANAGER_PREREQUISITE,
        )

    async def _delete_workspace(self, obj: Obj) -> bool:
        name = str(metadata_of(obj).get("name"))
        key = object_key(namespace_of(obj), name)
        self.workspace_applier.forget(key)
        if self.workspaces.indexer.get_by_key(key) is None:
            return False
        try:
            await self.workspace_applier.client.delete(name, namespace_of(obj))
        except ApiException as exc:
            if api_error_status(exc) != 404:
                raise
            return False
        return True

    async def _prune_history(self, obj: Obj, keep: frozenset[str]) -> None:
        """Delete completed Updates beyond the history limit (never the current or the last one)."""
        updates = self.updates.indexer.by_index(
            INDEX_UPDATES_BY_STACK, object_key(namespace_of(obj), str(metadata_of(obj).get("name")))
        )
        done = [
            u
            for u in updates
            if update_complete(u)
            and not metadata_of(u).get("deletionTimestamp")
            and metadata_of(u).get("name") not in keep
        ]
        done.sort(
            key=lambda u: (
                str(metadata_of(u).get("creationTimestamp") or ""),
                str(metadata_of(u).get("name")),
            )
        )
        excess = len(done) + len(keep) - self.history_limit
        for update in done[: max(excess, 0)]:
            try:
                await self._update_client.delete(
                    str(metadata_of(update)["name"]), namespace_of(update), uid=metadata_of(update).get("uid")
                )
            except ApiException as exc:
                if api_error_status(exc) not in (404, 409):
                    raise

    async def _release_update(self, update: Obj | None) -> None:
        """Drop the Stack's finalizer from a recorded Update (best effort: the Update controller
        also drops it from a recorded Update that is being deleted)."""
        if update is None or not has_finalizer(update, STACK_FINALIZER):
            return
        try:
            await remove_finalizer(
                self._update_client, update, STACK_FINALIZER, field_manager=FIELD_MANAGER_STACK_FINALIZER
            )
        except ApiException as exc:
            _log.info(
                "could not release update",
                update=metadata_of(update).get("name"),
                status=api_error_status(exc),
            )


def _after(requeue: float | None) -> Result:
    return Result.requeue_after(requeue) if requeue else Result.done()


def _namespace_terminating(exc: ApiException) -> bool:
    body = str(getattr(exc, "body", "") or "")
    return "NamespaceTerminating" in body or "being terminated" in body


def _ref(obj: Obj) -> StackRef:
    return StackRef(str(metadata_of(obj).get("name") or ""), str(namespace_of(obj) or ""))


def _terminating_message(obj: Obj, status: Obj) -> str:
    namespace = namespace_of(obj)
    detail = (status.get("lastUpdate") or {}).get("permalink") or "the Pulumi backend"
    return (
        f'namespace "{namespace}" is terminating, so a workspace cannot be created to run destroy; cloud '
        f"resources will NOT be deleted and must be cleaned up manually (see {detail}). The finalizer is "
        "retained to avoid silently orphaning resources. Once the resources are handled, release the Stack "
        f"with: {release_command(_ref(obj))}"
    )


# --- wiring ----------------------------------------------------------------------------------


def setup(manager: Manager, options: ControllerOptions | None = None, **kwargs: Any) -> StackReconciler:
    """Declare the stack controller on ``manager``."""
    reconciler = StackReconciler(manager, options, **kwargs)
    builder = (
        manager.controller(CONTROLLER_NAME, reconciler)
        .for_(STACKS, predicate=STACK_PREDICATE)
        .owns(WORKSPACES, predicate=workspace_predicate)
        .owns(UPDATES, controller_only=False, predicate=update_predicate)
        .watches_by_index(PROGRAMS, INDEX_PROGRAM, index_program, predicate=artifact_predicate)
        # A Stack becoming Ready runs the Stacks waiting on it at once (not at their next poll).
        .watches_by_index(STACKS, INDEX_PREREQUISITE, index_prerequisites, predicate=stack_became_ready)
    )
    for resource in FLUX_SOURCES:
        builder.watches(
            resource, _flux_mapper(reconciler, resource), predicate=artifact_predicate, optional=True
        )
    reconciler.stacks.add_event_handler(_StackEvents(reconciler))
    return reconciler


def _flux_mapper(reconciler: StackReconciler, resource: Resource) -> Callable[[Obj], list[str]]:
    """A Flux source's event -> the Stacks whose fluxSource names it."""
    index = reconciler.stacks.indexer

    def keys(obj: Obj) -> list[str]:
        key = flux_key(
            namespace_of(obj), resource.api_version, resource.kind, str(metadata_of(obj).get("name"))
        )
        return index.index_keys(INDEX_FLUX, key)

    return keys


class _StackEvents:
    """Stack informer events keep the gauges (as upstream's callbacks)."""

    def __init__(self, reconciler: StackReconciler) -> None:
        self.reconciler = reconciler

    def on_add(self, obj: Obj) -> None:
        self.reconciler.metrics.observe(obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        self.reconciler.metrics.observe(new)

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self.reconciler.metrics.forget(obj)
