"""The Stack reconciler: keeps a Pulumi stack up to date from a git repo, a Flux source or a Program.

One reconcile follows the Go operator's ``StackReconciler.Reconcile``:

1. record the result of ``status.currentUpdate`` once its Update completes (outputs from the
   Update's Secret, ``[secret]`` for secret keys); a ``currentUpdate`` whose Update is gone is
   detected (a direct read confirms the cache) and counted as a transient failure, so the Stack
   moves on instead of waiting forever (Go operator issue 1292);
2. resolve the source to a revision: a commit, a branch head (``ls-remote``, shared between
   Stacks, :mod:`pko.controllers.stack.branchpoll`), a Flux object's or Program's artifact; a
   destroy runs in the Workspace as it is when there is one, else from the source, or from
   ``status.projectInfo`` when the source is gone;
3. decide whether to run (:func:`pko.controllers.stack.status.plan_sync`); if not, report the
   result (Ready / retrying / Stalled) and requeue for the next resync, poll or retry;
4. check prerequisites, apply the Workspace (server-side apply), and when it is ready create one
   Update (never two: ``currentUpdate`` guards it).

pko's additions (issue 29) fit the same steps: a ``pulumi.com/cancel-request`` deletes the Update
in flight before step 1 (its reconciler cancels the operation); step 1 records each Update by what
it was for (``currentUpdate.kind``: a plan preview, an approved up, a refresh on request, a drift
check; one table, :mod:`pko.controllers.stack.kinds`); step 3 also runs a
``pulumi.com/refresh-request`` (again after a transient failure, once the Stack's transient backoff
is over: :mod:`pko.controllers.stack.refresh`), a due drift check
(:mod:`pko.controllers.stack.drift`) or a remediation, and sends an up through the approval gate
(:mod:`pko.controllers.stack.approval`), which may wait (``AwaitingApproval``) instead.

Each reconcile observes, decides, then acts, as the Workspace and Update reconciles do:
``_observe`` reads (the caches; then what no cache holds: the Update in flight when the cache lacks
it, its outputs Secret; the source with its Secrets and branch head only when a decision asks for
it, :mod:`pko.controllers.stack.sources`; a Secret or ConfigMap read refused, 403, decides nothing:
:func:`~pko.controllers.stack.outputs.unreadable`), the pure :func:`pko.controllers.stack.plan.decide` plans
the Stack's status, the ordered writes and the ``Result`` (a Stack that cannot be processed as
written is a planned ``Stalled`` status), and ``_act`` is the one place that writes, and the one
place the Stack's status is written (:class:`~pko.machinery.writes.StatusWriter`: skipped when
nothing changed, so an idle Stack costs no writes); a failure a write expects is planned from
(:func:`pko.controllers.stack.plan.refused`). The Workspace is applied only when its digest changed
(:class:`~pko.machinery.writes.DigestApplier`). Deletion with ``destroyOnFinalize`` runs a destroy
and removes the finalizer only after a destroy that succeeded for this deletion and deleted what
the Stack last deployed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import structlog

from pko.api.stack import Stack
from pko.api.validation import parse_stack
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
    WORKSPACE_TEMPLATES,
    WORKSPACES,
)
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.secretaccess import SecretAccess, SecretForbidden
from pko.controllers.sharding import recheck_foreign_update
from pko.controllers.stack.branchpoll import BranchResolver
from pko.controllers.stack.outputs import publishing_update, unreadable, update_outputs
from pko.controllers.stack.plan import decide, refused
from pko.controllers.stack.sources import SourceResolver
from pko.controllers.stack.status import (
    outputs_from_secret,
    utcnow,
)
from pko.controllers.stack.steps import (
    AddFinalizer,
    ApplyWorkspace,
    CancelUpdate,
    CreateUpdate,
    DeleteWorkspace,
    Emit,
    Failure,
    Log,
    Observed,
    OutputsWritten,
    Plan,
    PruneHistory,
    ReadSource,
    ReleaseUpdate,
    RemoveFinalizer,
    RequestReconcile,
    Settings,
    UpdateOutputs,
    Write,
    WriteOutputs,
    WriteStatus,
)
from pko.controllers.stack.takeover import take_over_status
from pko.controllers.stack.templates import (
    Templates,
    default_template_key,
    index_workspace_template,
    resolve_templates,
)
from pko.controllers.stack.updatewrites import HISTORY_LIMIT, cancel_update, prune_history, release_update
from pko.controllers.stack.waits import WAITS, Awaited, Wait
from pko.controllers.stack.watches import (
    FLUX_SOURCES,
    INDEX_FLUX,
    INDEX_PREREQUISITE,
    INDEX_PROGRAM,
    INDEX_TEMPLATE_FLUX,
    INDEX_UPDATES_BY_STACK,
    INDEX_WORKSPACE_TEMPLATE,
    STACK_PREDICATE,
    StackMetrics,
    artifact_predicate,
    flux_key,
    flux_source_predicate,
    flux_source_stacks,
    generation_changed,
    index_flux,
    index_prerequisites,
    index_program,
    index_template_flux,
    index_updates_by_stack,
    metadata_of,
    namespace_of,
    stack_became_ready,
    update_complete,
    update_predicate,
    workspace_predicate,
)
from pko.machinery.controller import Result
from pko.machinery.executor import Expected, execute
from pko.machinery.kubeclient import ApiException
from pko.machinery.manager import CACHE_SYNCED, CACHE_SYNCING, Manager
from pko.machinery.objects import add_finalizer, remove_finalizer
from pko.machinery.resource import CONFIGMAPS, SECRETS, Obj, Resource, api_error_status
from pko.machinery.store import DeletedFinalStateUnknown, object_key
from pko.machinery.writes import DigestApplier, StatusWriter

__all__ = [
    "CONTROLLER_NAME",
    "FLUX_SOURCES",
    "StackReconciler",
    "setup",
]

CONTROLLER_NAME: Final = "stack-controller"

_log = structlog.get_logger("pko.controllers.stack.reconciler")

# --- the reconciler --------------------------------------------------------------------------

# The failures each write expects (the rest propagate): see plan.refused.
_EXPECTED: Final[Expected] = {
    ApplyWorkspace: (ApiException,),
    CreateUpdate: (ApiException,),
    WriteOutputs: (ApiException,),
}


def _failure(exc: BaseException) -> Failure:
    """An expected failure as the pure planner sees it: the API's status and response body."""
    status = api_error_status(exc) if isinstance(exc, ApiException) else None
    return Failure(status, str(getattr(exc, "body", "") or exc))


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
    "plan",
    "drift",
    "observedRefreshRequest",
    "lastRefresh",
    "observedCancelRequest",
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
        waits: Mapping[Awaited, Wait] = WAITS,
    ) -> None:
        self.manager = manager
        self.options = options or ControllerOptions()
        self.retry = retry or self.options.retry
        self.branches = branches or BranchResolver()
        self.history_limit = history_limit
        self.stacks = manager.informer(
            STACKS,
            indexers={
                INDEX_PROGRAM: index_program,
                INDEX_PREREQUISITE: index_prerequisites,
                INDEX_FLUX: index_flux,
                INDEX_WORKSPACE_TEMPLATE: index_workspace_template,
            },
        )
        self.workspaces = manager.informer(WORKSPACES)
        self.updates = manager.informer(UPDATES, indexers={INDEX_UPDATES_BY_STACK: index_updates_by_stack})
        self.programs = manager.informer(PROGRAMS)
        self._stack_client = manager.client(STACKS)
        self._update_client = manager.client(UPDATES)
        self._secrets = manager.client(SECRETS)
        self._config_maps = manager.client(CONFIGMAPS)
        # Forced, as the other controllers' status writers are: the Go operator wrote these fields
        # with plain updates (filed under ``manager``), and after a switch a non-forced apply of any
        # value it left differently conflicts on every reconcile, for as long as the Stack exists.
        self.status_writer = StatusWriter(
            self.stacks, FIELD_MANAGER_STACK_STATUS, OWNED_STATUS, client=self._stack_client, force=True
        )
        # Forced too: the Workspace is this controller's to write, and the Go operator's writes of it
        # (another manager, or an update) must not hold it at their values after a switch.
        self.workspace_applier = DigestApplier(
            self.workspaces, FIELD_MANAGER, client=manager.client(WORKSPACES), force=True
        )
        allow_insecure = self.options.allow_insecure_git_credentials
        # Who the operator is and the role to bind: every refused Secret or ConfigMap read's message.
        self.access = SecretAccess.of(self.options)
        self.sources = SourceResolver(
            manager,
            self.programs,
            self._secrets,
            self.branches,
            allow_insecure_git_credentials=allow_insecure,
            program_server=self.options.program_fs_adv_addr,
            access=self.access,
        )
        self.events = manager.events
        self.metrics = StackMetrics(manager)
        # ``waits``: what a waiting Stack waits for and which waits look again on a timer (waits.py):
        # the Secret row's timer is the one setting of it (waits_with(secret_recheck=...): Secrets are
        # never watched); hack/bench/idlewaits.py gives the Program wait a timer again.
        self.settings = Settings(
            self.retry, self.options.workspace_image, OWNED_STATUS, allow_insecure, waits, self.access
        )
        self.default_template = default_template_key(
            self.options.default_workspace_template, self.options.operator_namespace
        )

    # --- entry point -------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        obj = self.stacks.latest(key)
        if obj is None:
            self.workspace_applier.forget(key)  # its Workspace (same name) goes with it
            return Result.done()
        try:
            observed = await self._observe(obj)
        except SecretForbidden as refused_read:
            plan = unreadable(obj, str(refused_read), self.settings.requeue(Awaited.SECRET))
            for write in plan.writes:  # none expected to fail, no decision after them
                await self._carry_out(obj, write)
            return plan.result
        return self._foreign_update_recheck(observed, await self._act(observed, decide(observed)))

    def _foreign_update_recheck(self, observed: Observed, result: Result) -> Result:
        """``result``, sooner when the Update in flight is another shard's (after a move): no watch of
        this shard wakes the Stack when it ends (:func:`~pko.controllers.sharding.recheck_foreign_update`)."""
        update = observed.current_update
        meta = metadata_of(update) if update is not None else {}
        cached = self.updates.indexer.get_by_key(object_key(meta.get("namespace"), str(meta.get("name"))))
        complete = update is not None and update_complete(update)
        delay = recheck_foreign_update(update, cached is not None, complete)
        if (
            delay is None
            or result.kind == "requeue"
            or (result.kind == "requeue_after" and result.delay <= delay)
        ):
            return result
        return Result.requeue_after(delay)

    # --- reading (caches first; then what no cache holds) ------------------------------------

    async def _observe(self, obj: Obj) -> Observed:
        """What every decision needs, read before deciding: the caches, the Update in flight (read
        directly when the cache lacks it: gone or not yet seen), its outputs Secret once it
        completed. The source (Secrets, the branch head) is read when a decision asks
        (:class:`~pko.controllers.stack.steps.ReadSource`)."""
        namespace, name = namespace_of(obj), str(metadata_of(obj).get("name"))
        parsed = parse_stack(obj)  # once per reconcile: the decision is given it (``Observed.parsed``)
        stack = parsed[0] if not parsed[1] else None  # errors: decided from them alone, nothing else read
        current_name = ((obj.get("status") or {}).get("currentUpdate") or {}).get("name")
        current = await self._current_update(namespace, str(current_name)) if current_name else None
        outputs: Obj | None = None
        secret_name = ((current or {}).get("status") or {}).get("outputs")
        secret: Obj | None = None
        if current is not None and update_complete(current) and secret_name:
            secret = await self.access.get_or_none(self._secrets, str(secret_name), namespace)
            outputs = outputs_from_secret(secret) if secret is not None else None
        published, target = await self._observe_published(obj, stack, current, secret)
        workspace = self.workspaces.indexer.get_by_key(object_key(namespace, name))
        prerequisites = {
            p.name: self.stacks.indexer.get_by_key(object_key(namespace, p.name))
            for p in (stack.spec.prerequisites or [] if stack is not None else [])
        }
        return Observed(
            obj,
            now=utcnow(),
            created=datetime.now(UTC),
            settings=self.settings,
            current_update=current,
            outputs=outputs,
            workspace=workspace,
            prerequisites=prerequisites,
            templates=self._templates(stack) if stack is not None else Templates(),
            update_outputs=published,
            outputs_object=target,
            parsed=parsed,
        )

    async def _observe_published(
        self, obj: Obj, stack: Stack | None, current: Obj | None, secret: Obj | None
    ) -> tuple[UpdateOutputs | None, Obj | None]:
        """For ``spec.outputs``, when an Update's outputs are to be written now
        (:func:`~pko.controllers.stack.outputs.publishing_update`): those outputs (its Secret,
        already read for the Update in flight) and the object of that name as it is (None: absent)."""
        status: Obj = obj.get("status") or {}
        namespace = namespace_of(obj)
        last_name = (status.get("lastUpdate") or {}).get("name")
        last = self.updates.indexer.get_by_key(object_key(namespace, str(last_name))) if last_name else None
        update = publishing_update(obj, stack, current, last)
        if update is None or stack is None or stack.spec.outputs is None:
            return None, None
        if update is not current:
            secret = await self.access.get_or_none(self._secrets, str(update["status"]["outputs"]), namespace)
        if secret is None:
            return None, None
        spec = stack.spec.outputs
        client = self._config_maps if spec.kind == "ConfigMap" else self._secrets
        target = await self.access.get_or_none(client, spec.name, namespace, "spec.outputs: ")
        return update_outputs(str(metadata_of(update).get("name")), secret), target

    def _templates(self, stack: Stack) -> Templates:
        """The WorkspaceTemplates ``stack``'s Workspace is built with, from the cache (the kind is
        watched optionally: an install whose CRDs predate it still runs every other Stack)."""
        cache = self.manager.optional_cache_status(WORKSPACE_TEMPLATES)
        served = cache == CACHE_SYNCED
        indexer = self.manager.informer(WORKSPACE_TEMPLATES).indexer if served else None
        return resolve_templates(
            stack,
            self.default_template,
            lambda key: indexer.get_by_key(key) if indexer is not None else None,
            served=served,
            # no event comes when the kind's cache syncs: looked at again (syncing: soon)
            recheck=self.settings.requeue(
                Awaited.TEMPLATE_KIND_SYNCING if cache == CACHE_SYNCING else Awaited.TEMPLATE_KIND
            ),
        )

    async def _current_update(self, namespace: str | None, name: str) -> Obj | None:
        """The Update in flight; None when it no longer exists (checked against the API)."""
        cached = self.updates.indexer.get_by_key(object_key(namespace, name))
        if cached is not None:
            return cached
        return await self._update_client.get_or_none(name, namespace)

    # --- acting: the one place a Stack reconcile writes ------------------------------------

    async def _act(self, observed: Observed, plan: Plan) -> Result:
        """Carry out ``plan`` (:func:`~pko.machinery.executor.execute`): its writes in order, then
        what it plans from the Workspace as applied; a failure a write expects (``_EXPECTED``) is
        planned from by :func:`refused`, any other propagates."""
        done = await execute(
            plan,
            functools.partial(self._carry_out, observed.obj),
            expected=_EXPECTED,
            failure_of=_failure,
            refused=functools.partial(refused, observed),
            follow=lambda plan, applied: plan.then(applied) if plan.then and applied is not None else None,
        )
        return done.result

    async def _carry_out(self, obj: Obj, write: Write) -> Any:
        """One write; its answer: the Workspace, when it applied one; the source, when it read it."""
        if isinstance(write, ReadSource):
            return await self.sources.resolve(obj, write.stack, write.packs)
        if isinstance(write, WriteStatus):
            await self._write_status(obj, write.status)
            await release_update(self._update_client, write.recorded)
        elif isinstance(write, AddFinalizer):
            written = self.stacks.wrote(await add_finalizer(self._stack_client, obj, STACK_FINALIZER))
            obj["metadata"] = written.get("metadata") or obj.get("metadata")
        elif isinstance(write, RemoveFinalizer):
            self.stacks.wrote(await remove_finalizer(self._stack_client, obj, STACK_FINALIZER))
        elif isinstance(write, Emit):
            self.events.event(obj, write.type, write.reason, write.message)
        elif isinstance(write, Log):
            _log.info(write.event, **write.fields)
        elif isinstance(write, ApplyWorkspace):
            workspace, _ = await self.workspace_applier.ensure(write.body)
            return workspace
        elif isinstance(write, CreateUpdate):
            # The Update carries the Stack's finalizer from birth: its manager is upstream's name for it.
            await self._update_client.create(write.body, field_manager=FIELD_MANAGER_STACK_FINALIZER)
        elif isinstance(write, CancelUpdate):
            await cancel_update(self._update_client, namespace_of(obj), write.name, write.uid)
        elif isinstance(write, DeleteWorkspace):
            if await self._delete_workspace(obj):
                self.events.event(obj, "Normal", "WorkspaceDeleted", "Workspace deleted per reclaim policy")
        elif isinstance(write, ReleaseUpdate):
            await release_update(self._update_client, write.update)
        elif isinstance(write, PruneHistory):
            await prune_history(
                self._update_client, self.updates.indexer, obj, write.keep, self.history_limit
            )
        elif isinstance(write, RequestReconcile):
            await self._request_reconcile(namespace_of(obj), write.stack, write.request)
        elif isinstance(write, WriteOutputs):
            client = self._config_maps if write.body.get("kind") == "ConfigMap" else self._secrets
            if write.existing:
                await client.replace(write.body, field_manager=FIELD_MANAGER)
            else:
                await client.create(write.body, field_manager=FIELD_MANAGER)
            return OutputsWritten()
        return None

    async def _write_status(self, obj: Obj, status: Obj) -> None:
        """Apply the status this controller owns (skipped when unchanged); ``obj`` then holds it.
        A status another manager still holds parts of (the Go operator's, after a switch: refused
        half removed, or left other than written) is taken over, then written again."""
        try:
            written = await self.status_writer.write(obj, status)
        except ApiException as exc:
            if api_error_status(exc) != 422 or not await self._take_over_status(obj):
                raise
            written = await self.status_writer.write(obj, status)
        else:
            if written is not None and self.status_writer.changed(written, status):
                if await self._take_over_status(written):
                    written = await self.status_writer.write(written, status) or written
        if written is not None:
            self.metrics.observe(written)
            # Later writes in this reconcile compare with what is now stored.
            obj["metadata"] = written.get("metadata") or obj.get("metadata")
            obj["status"] = written.get("status") or {}

    async def _take_over_status(self, obj: Obj) -> bool:
        """Hand the other managers' claims on the Stack's status to this controller's apply entry
        (:mod:`pko.controllers.stack.takeover`); False when no other manager claims it."""
        meta = metadata_of(obj)
        name, namespace = str(meta.get("name")), namespace_of(obj)
        fresh = await self._stack_client.get(name, namespace)
        managed = (fresh.get("metadata") or {}).get("managedFields") or []
        entries = take_over_status(managed, FIELD_MANAGER_STACK_STATUS, STACKS.api_version, utcnow())
        if entries is None:
            return False
        version = (fresh.get("metadata") or {}).get("resourceVersion")
        await self._stack_client.patch(
            name,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                {"op": "replace", "path": "/metadata/managedFields", "value": entries},
            ],
            namespace=namespace,
            patch_type="json",
            field_manager=FIELD_MANAGER_STACK_STATUS,
        )
        others = sorted({str(e.get("manager")) for e in managed if e.get("subresource") == "status"})
        _log.info(
            "took the Stack's status over from its earlier managers",
            stack=f"{namespace}/{name}",
            managers=others,
        )
        return True

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
        # A WorkspaceTemplate created, changed or deleted: the Stacks built with it (optional: an
        # install whose CRDs predate the kind runs on).
        .watches(
            WORKSPACE_TEMPLATES, _template_mapper(reconciler), predicate=generation_changed, optional=True
        )
    )
    # The packs' Flux sources each template enforces (the Flux watch's way to the Stacks built with it).
    manager.informer(WORKSPACE_TEMPLATES, indexers={INDEX_TEMPLATE_FLUX: index_template_flux})
    for resource in FLUX_SOURCES:
        builder.watches(
            resource, _flux_mapper(reconciler, resource), predicate=flux_source_predicate, optional=True
        )
    reconciler.stacks.add_event_handler(_StackEvents(reconciler))
    return reconciler


def _template_mapper(reconciler: StackReconciler) -> Callable[[Obj], list[str]]:
    """A WorkspaceTemplate's event -> the Stacks that reference it; every Stack for the default."""
    index = reconciler.stacks.indexer

    def keys(obj: Obj) -> list[str]:
        key = object_key(namespace_of(obj), str(metadata_of(obj).get("name")))
        if key == reconciler.default_template:
            return index.list_keys()
        return index.index_keys(INDEX_WORKSPACE_TEMPLATE, key)

    return keys


def _flux_mapper(reconciler: StackReconciler, resource: Resource) -> Callable[[Obj], list[str]]:
    """A Flux source's event -> the Stacks that read it: their fluxSource or a policy pack's, their
    own or one their WorkspaceTemplates enforce (watches.flux_source_stacks). The WorkspaceTemplate
    cache is taken once, here (the manager's one informer of the kind, made before the mappers)."""
    stacks, templates = reconciler.stacks.indexer, reconciler.manager.informer(WORKSPACE_TEMPLATES).indexer

    def keys(obj: Obj) -> list[str]:
        key = flux_key(
            namespace_of(obj), resource.api_version, resource.kind, str(metadata_of(obj).get("name"))
        )
        return flux_source_stacks(key, stacks, templates, reconciler.default_template)

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
