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

Reads come from the informer caches; Secrets (git credentials, outputs) are read directly and never
cached. Every status write is one server-side apply of the fields this controller owns, skipped
when nothing changed, so an idle Stack costs no writes. Deletion with ``destroyOnFinalize`` runs a
destroy and removes the finalizer only after a destroy that succeeded for this deletion.
"""

from __future__ import annotations

import base64
import json
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
    FIELD_MANAGER_STACK_STATUS,
    PROGRAMS,
    RECONCILIATION_REQUEST_ANNOTATION,
    STACK_FINALIZER,
    STACKS,
    UPDATES,
    WORKSPACES,
)
from pko.controllers.stack.branchpoll import BranchResolver, GitCredentials, GitLookupError
from pko.controllers.stack.retry import RetrySettings
from pko.controllers.stack.status import (
    MSG_UPDATE,
    MSG_WORKSPACE,
    mark_ready,
    mark_reconciling,
    mark_result,
    mark_stalled,
    mark_suspended,
    outputs_from_secret,
    plan_sync,
    reconcile_request,
    record_failed,
    record_lost,
    record_succeeded,
    requirement_error,
    utcnow,
)
from pko.controllers.stack.updateobject import build_update, update_type_for
from pko.controllers.stack.watches import (
    FLUX_SOURCES,
    INDEX_FLUX,
    INDEX_PREREQUISITE,
    INDEX_PROGRAM,
    INDEX_UPDATES_BY_STACK,
    STACK_PREDICATE,
    StackMetrics,
    artifact_of,
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
)
from pko.controllers.stack.workspaceobject import (
    ArtifactRevision,
    GitRevision,
    ProjectInfoRevision,
    ResolvedSource,
    build_workspace,
)
from pko.controllers.workspace.workloads import ANNOTATION_APPLIED_DIGEST, applied_digest
from pko.machinery.conditions import get_condition, is_true
from pko.machinery.controller import Result
from pko.machinery.manager import CACHE_SYNCED, Manager
from pko.machinery.objects import add_finalizer, has_finalizer, remove_finalizer
from pko.machinery.resource import SECRETS, Obj, Resource, ResourceClient, api_error_status
from pko.machinery.store import DeletedFinalStateUnknown, object_key

__all__ = [
    "CONTROLLER_NAME",
    "FLUX_SOURCES",
    "StackReconciler",
    "setup",
]

CONTROLLER_NAME: Final = "stack-controller"
SOURCE_UNAVAILABLE_REQUEUE: Final = 30.0
# Secrets are not watched (never cached cluster-wide): a missing one is looked for again this often,
# so creating it later un-stalls the Stack without a spec change.
SECRET_RECHECK: Final = 120.0
HISTORY_LIMIT: Final = 5
"""Completed Updates kept per Stack (their outputs Secrets go with them): no pile-up (Go issue 1163)."""
DEPRECATED_FIELD_REASON: Final = "DeprecatedField"  # a pko Event: upstream only documents the deprecations

_log = structlog.get_logger("pko.controllers.stack.reconciler")

# --- the reconciler --------------------------------------------------------------------------


class _Stall(Exception):
    """The Stack cannot be processed as written; ``reason`` is a Stalled reason."""

    def __init__(self, reason: str, message: str, requeue: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.requeue = requeue


_OWNED_STATUS: Final = (
    "observedGeneration",
    "observedReconcileRequest",
    "conditions",
    "outputs",
    "lastUpdate",
    "currentUpdate",
    "projectInfo",
    "nextRetryTime",
    "lastFailure",
)


def _decode(secret: Obj, key: str) -> str | None:
    value = (secret.get("data") or {}).get(key)
    if value is None:
        return None
    return base64.b64decode(value).decode()


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
        self._ws_client = ResourceClient(api, WORKSPACES)
        # Workspace key -> (digest, generation) of this controller's last apply: skips no-op applies.
        self._ws_applied: dict[str, tuple[str, int]] = {}
        self._update_client = ResourceClient(api, UPDATES)
        self._secrets = ResourceClient(api, SECRETS)
        self.events = manager.events
        self.metrics = StackMetrics(manager)

    # --- entry point -------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        obj = self.stacks.latest(key)
        if obj is None:
            self._ws_applied.pop(key, None)  # its Workspace (same name) goes with it
            return Result.done()
        meta = metadata_of(obj)
        deleting = bool(meta.get("deletionTimestamp"))
        if deleting and not has_finalizer(obj, STACK_FINALIZER):
            return Result.done()
        if not deleting and not has_finalizer(obj, STACK_FINALIZER):
            obj = self.stacks.wrote(await add_finalizer(self._stack_client, obj, STACK_FINALIZER))
            meta = metadata_of(obj)
        now = utcnow()
        generation = int(meta.get("generation") or 0)
        status: Obj = {k: v for k, v in (obj.get("status") or {}).items() if k in _OWNED_STATUS}
        status["observedGeneration"] = generation
        status["observedReconcileRequest"] = reconcile_request(obj)
        stack, errors = parse_stack(obj)
        if stack is None or errors:
            message = format_errors(errors)
            if deleting and not (obj.get("status") or {}).get("lastUpdate"):
                self.stacks.wrote(await remove_finalizer(self._stack_client, obj, STACK_FINALIZER))
                return Result.done()
            self.events.event(obj, "Warning", "StackConfigInvalid", message)
            mark_stalled(status, "SpecInvalid", message, generation, now)
            await self._save(obj, status)
            return Result.done()
        if int((obj.get("status") or {}).get("observedGeneration") or 0) != generation:
            # Once per generation (the recorder folds repeats of a retried reconcile into one Event).
            for warning in deprecation_warnings(stack.spec):
                self.events.event(obj, "Warning", DEPRECATED_FIELD_REASON, warning)
        try:
            return await self._reconcile(obj, stack, status, now)
        except _Stall as stall:
            mark_stalled(status, stall.reason, stall.message, generation, now)
            await self._save(obj, status)
            return Result.requeue_after(stall.requeue) if stall.requeue else Result.done()

    async def _reconcile(self, obj: Obj, stack: Stack, status: Obj, now: datetime) -> Result:
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
                await self._save(obj, status)
                return Result.done()
            else:
                await self._record(obj, status, current, update, now)
                status.pop("currentUpdate", None)
                recorded = update

        # nothing to destroy: release the Stack (its Workspace and Updates go with it)
        if deleting and (not spec.destroy_on_finalize or spec.preview):
            mark_ready(status, generation, now)
            await self._save(obj, status, recorded)
            self.stacks.wrote(await remove_finalizer(self._stack_client, obj, STACK_FINALIZER))
            return Result.done()

        # 2. the source, pinned to a revision
        try:
            source, commit = await self._resolve_source(obj, stack, status, deleting)
        except _Stall as stall:
            mark_stalled(status, stall.reason, stall.message, generation, now)
            await self._save(obj, status, recorded)
            return Result.requeue_after(stall.requeue) if stall.requeue else Result.done()

        # 3. run, or report and wait
        polls_branch = bool(spec.project_repo and spec.branch)
        decision = plan_sync(obj, spec, status, commit, now, self.retry, polls_branch=polls_branch)
        mark_suspended(status, spec.suspend and not deleting, generation, now)
        if decision.synced:
            mark_result(status, spec, self.retry, generation, now)
            mark_suspended(status, spec.suspend and not deleting, generation, now)
            return await self._synced(obj, stack, status, decision.requeue_after, recorded, deleting)
        if spec.suspend and not deleting:
            await self._save(obj, status, recorded)
            return Result.done()

        # 4. prerequisites (not when deleting: a missing prerequisite must not block deletion)
        if not deleting:
            unmet = await self._prerequisites(obj, stack, now)
            if unmet is not None:
                mark_reconciling(status, "PrerequisiteNotSatisfied", unmet, generation, now)
                await self._save(obj, status, recorded)
                return Result.done()

        # 5. the Workspace
        mark_reconciling(status, "StackProcessing", MSG_WORKSPACE, generation, now)
        await self._save(obj, status, recorded)
        recorded = None
        workspace = await self._apply_workspace(obj, stack, source, status)
        if not workspace_ready(workspace):
            conditions = (workspace.get("status") or {}).get("conditions")
            stalled = get_condition(conditions, "Stalled")
            if stalled is not None and stalled.get("status") == "True":
                if deleting and not status.get("lastUpdate"):
                    self.stacks.wrote(await remove_finalizer(self._stack_client, obj, STACK_FINALIZER))
                    return Result.done()
                ws_reason = str(stalled.get("reason") or "")
                reason = (
                    "PulumiVersionTooLow" if ws_reason == "IncompatibleConfiguration" else "WorkspaceFailed"
                )
                mark_stalled(status, reason, f"{ws_reason}: {stalled.get('message', '')}", generation, now)
                await self._save(obj, status)
            return Result.done()

        # 6. one Update
        type_ = update_type_for(stack, deleting=deleting)
        update = build_update(stack, workspace, type_, decision.message, now=datetime.now(UTC))
        update_name = update["metadata"]["name"]
        status["currentUpdate"] = {
            "generation": generation,
            "reconcileRequest": reconcile_request(obj),
            "name": update_name,
            "commit": commit,
        }
        mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
        await self._save(obj, status)
        self.events.event(obj, "Normal", "StackUpdateDetected", decision.message)
        try:
            await self._update_client.create(update)
        except ApiException as exc:
            if api_error_status(exc) != 409:  # 409: it exists, so it is ours and in flight
                status.pop("currentUpdate", None)
                await self._save(obj, status)
            raise
        return Result.done()

    # --- steps -------------------------------------------------------------------------------

    async def _current_update(self, obj: Obj, name: str) -> Obj | None:
        """The Update in flight; None when it no longer exists (checked against the API)."""
        cached = self.updates.indexer.get_by_key(object_key(namespace_of(obj), name))
        if cached is not None:
            return cached
        return await self._get(self._update_client, name, namespace_of(obj))

    async def _record(self, obj: Obj, status: Obj, current: Obj, update: Obj, now: datetime) -> None:
        conditions = (update.get("status") or {}).get("conditions")
        if is_true(conditions, "Failed"):
            record_failed(status, current, update, now)
            message = (update.get("status") or {}).get("message") or ""
            self.events.event(obj, "Warning", "StackUpdateFailure", f"Failed to update stack: {message}")
            return
        outputs: Obj | None = None
        secret_name = (update.get("status") or {}).get("outputs")
        if secret_name:
            secret = await self._get(self._secrets, str(secret_name), namespace_of(update))
            if secret is not None:
                outputs = outputs_from_secret(secret)
        record_succeeded(status, current, update, outputs, now)
        self.events.event(obj, "Normal", "StackCreated", "Successfully updated stack")

    async def _synced(
        self, obj: Obj, stack: Stack, status: Obj, requeue: float | None, recorded: Obj | None, deleting: bool
    ) -> Result:
        last = status.get("lastUpdate") or {}
        if deleting:
            if last.get("state") != "succeeded":
                # A failed destroy keeps the finalizer: the stack's resources would be orphaned.
                await self._save(obj, status, recorded)
                return Result.requeue_after(requeue) if requeue else Result.done()
            await self._save(obj, status, recorded)
            self.stacks.wrote(await remove_finalizer(self._stack_client, obj, STACK_FINALIZER))
            return Result.done()
        if last.get("state") == "succeeded" and stack.spec.workspace_reclaim_policy == "Delete":
            await self._release_update(recorded)
            recorded = None
            if await self._delete_workspace(obj):
                self.events.event(obj, "Normal", "WorkspaceDeleted", "Workspace deleted per reclaim policy")
        await self._save(obj, status, recorded)
        await self._prune_history(obj, status)
        return Result.requeue_after(requeue) if requeue else Result.done()

    async def _resolve_source(
        self, obj: Obj, stack: Stack, status: Obj, deleting: bool
    ) -> tuple[ResolvedSource | None, str]:
        spec = stack.spec
        info = status.get("projectInfo") or {}
        if deleting and spec.destroy_on_finalize and not spec.run_program and info.get("name"):
            # Destroy from the saved state: the source may be gone by now (Go v2.8 projectInfo).
            return ProjectInfoRevision(str(info["name"]), str(info.get("runtime") or "")), ""
        namespace = namespace_of(obj)
        if spec.project_repo:
            creds = await self._git_credentials(stack)
            commit = spec.commit or ""
            if not commit:
                try:
                    commit = await self.branches.head(
                        spec.project_repo, spec.branch or "", creds, float(spec.resync_frequency())
                    )
                except GitLookupError as exc:
                    raise _Stall("SourceUnavailable", str(exc), SOURCE_UNAVAILABLE_REQUEUE) from exc
            return GitRevision(spec.project_repo, commit, spec.repo_dir, spec.shallow), commit
        if spec.flux_source is not None:
            ref = spec.flux_source.source_ref
            resource = self._flux_resource(ref.api_version, ref.kind)
            if resource is None:
                raise _Stall(
                    "SpecInvalid",
                    f"cannot process source reference: unsupported Flux source {ref.api_version} {ref.kind}",
                )
            if self.manager.optional_cache_status(resource) != CACHE_SYNCED:
                raise _Stall(
                    "SourceUnavailable",
                    f"could not resolve sourceRef: {resource.kind} ({resource.api_version}) is not served "
                    "by the cluster (are Flux's CRDs installed?)",
                    SOURCE_UNAVAILABLE_REQUEUE,
                )
            source_obj = self.manager.informer(resource).indexer.get_by_key(object_key(namespace, ref.name))
            if source_obj is None:
                raise _Stall(
                    "SourceUnavailable",
                    f'could not resolve sourceRef: {resource.plural}.{resource.group} "{ref.name}" not found',
                    SOURCE_UNAVAILABLE_REQUEUE,
                )
            artifact = artifact_of(source_obj)
            if artifact is None:
                ready = get_condition((source_obj.get("status") or {}).get("conditions"), "Ready")
                detail = (
                    f" ({ready.get('reason')}: {ready.get('message')})"
                    if ready and ready.get("status") != "True"
                    else ""
                )
                raise _Stall(
                    "SourceUnavailable", f"Flux source has no artifact{detail}", SOURCE_UNAVAILABLE_REQUEUE
                )
            revision = str(artifact.get("revision") or "")
            digest = str(artifact.get("digest") or "")
            # The digest is what changed (Flux may keep the revision for new content, e.g. a new
            # ignore rule), so it is the "commit" compared and recorded, as upstream does.
            return ArtifactRevision(
                str(artifact["url"]), digest, revision, spec.flux_source.dir
            ), digest or revision
        if spec.program_ref is not None:
            program = self.programs.indexer.get_by_key(object_key(namespace, spec.program_ref.name))
            if program is None:
                raise _Stall(
                    "SourceUnavailable", "unable to retrieve program for stack", SOURCE_UNAVAILABLE_REQUEUE
                )
            artifact = artifact_of(program)
            if artifact is None:
                raise _Stall("SourceUnavailable", "Program has no artifact", SOURCE_UNAVAILABLE_REQUEUE)
            revision = str(artifact.get("revision") or "")
            digest = str(artifact.get("digest") or "")
            return ArtifactRevision(str(artifact["url"]), digest, revision), digest or revision
        return None, ""

    def _flux_resource(self, api_version: str, kind: str) -> Resource | None:
        group, _, version = api_version.partition("/")
        for resource in FLUX_SOURCES:
            if resource.group == group and resource.version == version and resource.kind == kind:
                return resource
        return None

    async def _secret_value(self, namespace: str | None, name: str, key: str, what: str) -> str:
        secret = await self._get(self._secrets, name, namespace)
        if secret is None:
            raise _Stall(
                "SpecInvalid",
                f'{what}: unable to get secret {namespace}/{name}: secrets "{name}" not found',
                self.secret_recheck,
            )
        value = _decode(secret, key)
        if value is None:
            raise _Stall(
                "SpecInvalid",
                f'{what}: no key "{key}" found in secret {namespace}/{name}',
                self.secret_recheck,
            )
        return value

    async def _git_credentials(self, stack: Stack) -> GitCredentials:
        """Credentials for the branch lookup, read from Secrets (Go: resolveGitAuth)."""
        spec = stack.spec
        namespace = stack.metadata.namespace
        if spec.git_auth_secret:
            name = spec.git_auth_secret
            secret = await self._get(self._secrets, name, namespace)
            if secret is None:
                raise _Stall(
                    "SpecInvalid",
                    f'unable to get secret {namespace}/{name}: secrets "{name}" not found',
                    self.secret_recheck,
                )
            if _decode(secret, "sshPrivateKey") is not None:
                return GitCredentials(
                    ssh_private_key=_decode(secret, "sshPrivateKey"), password=_decode(secret, "password")
                )
            if _decode(secret, "accessToken") is not None:
                return GitCredentials(token=_decode(secret, "accessToken"))
            if _decode(secret, "username") is not None:
                password = _decode(secret, "password")
                if password is None:
                    raise _Stall(
                        "SpecInvalid",
                        f'creating gitAuth: no key "password" found in secret {namespace}/{name}',
                        self.secret_recheck,
                    )
                return GitCredentials(username=_decode(secret, "username"), password=password)
            return GitCredentials()
        auth = spec.git_auth
        if auth is None:
            return GitCredentials()

        async def value(ref: Any, what: str) -> str:
            return await self._secret_value(
                namespace, ref.secret.name, ref.secret.key, f"resolving gitAuth {what}"
            )

        if auth.ssh_auth is not None:
            key = await value(auth.ssh_auth.ssh_private_key, "SSH private key")
            password = await value(auth.ssh_auth.password, "SSH password") if auth.ssh_auth.password else None
            return GitCredentials(ssh_private_key=key, password=password)
        if auth.access_token is not None:
            return GitCredentials(token=await value(auth.access_token, "personal access token"))
        if auth.basic_auth is not None:
            return GitCredentials(
                username=await value(auth.basic_auth.user_name, "username"),
                password=await value(auth.basic_auth.password, "password"),
            )
        # A GitHub App token is minted by the workspace's fetch step; the lookup goes without.
        return GitCredentials()

    async def _prerequisites(self, obj: Obj, stack: Stack, now: datetime) -> str | None:
        """None when every prerequisite is satisfied, else the message (Go's wording)."""
        failed: list[str] = []
        message: str | None = None
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
                await self._stack_client.apply(
                    {
                        "apiVersion": "pulumi.com/v1",
                        "kind": "Stack",
                        "metadata": {
                            "name": prereq.name,
                            "namespace": namespace_of(obj),
                            "annotations": {RECONCILIATION_REQUEST_ANNOTATION: error.touch},
                        },
                    },
                    field_manager=FIELD_MANAGER_PREREQUISITE,
                )
        if len(failed) > 1:
            message = f"multiple prerequisites were not satisfied {', '.join(failed)}"
        return message

    async def _apply_workspace(
        self, obj: Obj, stack: Stack, source: ResolvedSource | None, status: Obj
    ) -> Obj:
        try:
            body = build_workspace(stack, source)
        except ValueError as exc:
            raise _Stall("SpecInvalid", str(exc)) from exc
        spec = body["spec"]
        if not spec.get("image"):
            # Named on the Workspace (as upstream's workspaces show it): `kubectl get workspace`
            # then says which image runs, and a new operator default rolls the pod visibly.
            spec["image"] = self.options.workspace_image(spec.get("securityProfile"))
        digest = applied_digest(body)
        body["metadata"].setdefault("annotations", {})[ANNOTATION_APPLIED_DIGEST] = digest
        key = object_key(namespace_of(obj), body["metadata"]["name"])
        cached = self.workspaces.indexer.get_by_key(key)
        if cached is not None and _applied(cached, digest, self._ws_applied.get(key)):
            return cached  # what we would apply is there: no request (one less write per reconcile)
        try:
            applied = await self._ws_client.apply(body, field_manager=FIELD_MANAGER)
            self._ws_applied[key] = (digest, int(metadata_of(applied).get("generation") or 0))
            return applied
        except ApiException as exc:
            if metadata_of(obj).get("deletionTimestamp") and _namespace_terminating(exc):
                raise _Stall(
                    "NamespaceTerminating", _terminating_message(obj, status), SOURCE_UNAVAILABLE_REQUEUE
                ) from exc
            raise

    async def _delete_workspace(self, obj: Obj) -> bool:
        name = str(metadata_of(obj).get("name"))
        key = object_key(namespace_of(obj), name)
        self._ws_applied.pop(key, None)
        if self.workspaces.indexer.get_by_key(key) is None:
            return False
        try:
            await self._ws_client.delete(name, namespace_of(obj))
        except ApiException as exc:
            if api_error_status(exc) != 404:
                raise
            return False
        return True

    async def _prune_history(self, obj: Obj, status: Obj) -> None:
        """Delete completed Updates beyond the history limit (never the current or the last one)."""
        updates = self.updates.indexer.by_index(
            INDEX_UPDATES_BY_STACK, object_key(namespace_of(obj), str(metadata_of(obj).get("name")))
        )
        keep = {(status.get("currentUpdate") or {}).get("name"), (status.get("lastUpdate") or {}).get("name")}
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
        excess = len(done) + len(keep - {None}) - self.history_limit
        for update in done[: max(excess, 0)]:
            try:
                await self._update_client.delete(
                    str(metadata_of(update)["name"]), namespace_of(update), uid=metadata_of(update).get("uid")
                )
            except ApiException as exc:
                if api_error_status(exc) not in (404, 409):
                    raise

    # --- writes ------------------------------------------------------------------------------

    async def _save(self, obj: Obj, status: Obj, recorded: Obj | None = None) -> None:
        """Apply the status this controller owns (skipped when unchanged), then release the
        recorded Update (its result is now in the Stack's status)."""
        cached = {k: v for k, v in (obj.get("status") or {}).items() if k in _OWNED_STATUS}
        desired = {k: v for k, v in status.items() if k in _OWNED_STATUS and v is not None}
        if json.dumps(cached, sort_keys=True) != json.dumps(desired, sort_keys=True):
            body = {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": metadata_of(obj).get("name"), "namespace": namespace_of(obj)},
                "status": desired,
            }
            written = self.stacks.wrote(
                await self._stack_client.apply_status(body, field_manager=FIELD_MANAGER_STACK_STATUS)
            )
            self.metrics.observe(written)
            # Later writes in this reconcile compare with what is now stored.
            obj["metadata"] = written.get("metadata") or obj.get("metadata")
            obj["status"] = written.get("status") or {}
        await self._release_update(recorded)

    async def _release_update(self, update: Obj | None) -> None:
        """Drop the Stack's finalizer from a recorded Update (best effort: the Update controller
        also drops it from a recorded Update that is being deleted)."""
        if update is None or not has_finalizer(update, STACK_FINALIZER):
            return
        try:
            await remove_finalizer(self._update_client, update, STACK_FINALIZER)
        except ApiException as exc:
            _log.info(
                "could not release update",
                update=metadata_of(update).get("name"),
                status=api_error_status(exc),
            )

    async def _get(self, client: ResourceClient, name: str, namespace: str | None) -> Obj | None:
        try:
            return await client.get(name, namespace)
        except ApiException as exc:
            if api_error_status(exc) == 404:
                return None
            raise


def _applied(cached: Obj, digest: str, last: tuple[str, int] | None) -> bool:
    """The cached Workspace is what this controller last applied (``last``: digest, generation) and
    nobody changed it since (same generation): applying ``digest`` again would change nothing."""
    meta = metadata_of(cached)
    if last is None or meta.get("deletionTimestamp"):
        return False
    current = (meta.get("annotations") or {}).get(ANNOTATION_APPLIED_DIGEST)
    return current == digest == last[0] and int(meta.get("generation") or 0) == last[1]


def _namespace_terminating(exc: ApiException) -> bool:
    body = str(getattr(exc, "body", "") or "")
    return "NamespaceTerminating" in body or "being terminated" in body


def _terminating_message(obj: Obj, status: Obj) -> str:
    name, namespace = metadata_of(obj).get("name"), namespace_of(obj)
    detail = (status.get("lastUpdate") or {}).get("permalink") or "the Pulumi backend"
    return (
        f'namespace "{namespace}" is terminating, so a workspace cannot be created to run destroy; cloud '
        f"resources will NOT be deleted and must be cleaned up manually (see {detail}). The finalizer is "
        "retained to avoid silently orphaning resources. Once the resources are handled, release the Stack "
        f"with: kubectl patch stack {name} -n {namespace} --type=merge "
        """-p '{"metadata":{"finalizers":[]}}'"""
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
