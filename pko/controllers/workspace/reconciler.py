"""The Workspace reconciler: a StatefulSet (one pod running the agent) and a headless Service per
Workspace, and a ``Ready`` condition that says what a user can do when the pod does not come up.

One reconcile, reading only caches (Workspaces, and the StatefulSets, Services and Pods labelled
``auto.pulumi.com/component=workspace``):

1. A Workspace being deleted is ``Ready=False/Deleting``; its objects go by garbage collection.
2. The Service and the StatefulSet (:mod:`pko.controllers.workspace.workloads`) are server-side applied as
   ``pulumi-kubernetes-operator`` only when the cached object's ``auto.pulumi.com/applied-digest``
   differs from the desired one: a settled Workspace costs no writes. A change to an immutable
   StatefulSet field (selector, serviceName, volumeClaimTemplates, podManagementPolicy) deletes it
   (uid precondition), emits ``Migrated`` and requeues after 5 s (the Go operator's migration). A
   StatefulSet the apiserver refuses for any other reason is the user's spec: ``SpecInvalid``,
   Stalled, no retry until the spec changes.
3. The rollout: ``RollingUpdate`` until the StatefulSet controller has seen the new template and
   replaced the pod (with ``podManagementPolicy: Parallel`` it replaces an old pod that never
   became ready, the Go operator's issue 801, so a fixed spec takes effect; the tests prove it
   against the real StatefulSet controller); a pod the apiserver refuses (the StatefulSet API
   accepts templates its pods fail) is reported from a dry-run create; then the pod itself is read
   (:func:`~pko.controllers.workspace.workloads.diagnose_pod`): image pull failures, a failing init
   container with its last log lines (Stalled after repeated failures), a crash loop, an
   unschedulable pod... Pod and StatefulSet events drive this; nothing polls.
4. A Ready pod not yet ``auto.pulumi.com/initialized`` is initialized through its agent (token
   audience ``<ws>.<ns>``, a TokenRequest for the operator's own ServiceAccount): PulumiVersion,
   the JSON-config version check, Install, then each of ``spec.stacks`` (SelectStack,
   SetAllConfig, AddEnvironments); then the pod is annotated (a new pod initializes again).
   Reasons and events are the Go operator's (``ConnectionFailed`` with a 5 s requeue, the gRPC
   code such as ``Unauthenticated``, ``Installing``, ``InstallationFailed``, ``Initializing``,
   ``InitializationFailed``, ``IncompatibleConfiguration``, then ``Succeeded``).

Status goes by server-side apply of ``/status`` as ``pulumi-kubernetes-operator/workspace-status``
and only when it differs from the cached one. ``Stalled`` always reflects this reconcile's finding
(it goes away as soon as the problem does), except while deleting.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, cast

import structlog
from kubernetes_asyncio.client import ApiException, CoreV1Api

from pko.agentclient import AgentClient, AgentError, audience, resolve_address
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from pko.api.workspace import WorkspaceSpec
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import (
    FIELD_MANAGER,
    FIELD_MANAGER_WORKSPACE_STATUS,
    WORKSPACE_NAME_LABEL,
    WORKSPACE_SELECTOR,
    WORKSPACES,
)
from pko.controllers.workspace.workloads import (
    ANNOTATION_INITIALIZED,
    REVISION_LABEL,
    PodDiagnosis,
    SpecInvalid,
    desired_service,
    desired_statefulset,
    diagnose_pod,
    immutable_fields_changed,
    parse_spec,
    pod_name,
    statefulset_name,
)
from pko.machinery.conditions import ConditionStatus, get_condition, remove_condition, set_condition
from pko.machinery.controller import Result
from pko.machinery.manager import Manager
from pko.machinery.objects import controller_of
from pko.machinery.predicates import deletion_started, generation_changed, or_
from pko.machinery.resource import PODS, SERVICES, STATEFULSETS, Obj, ResourceClient, api_error_status
from pko.machinery.store import object_key
from pko.machinery.writes import DigestApplier, StatusWriter
from pko.tokens import TokenError, TokenSource

__all__ = [
    "CONTROLLER_NAME",
    "JSON_CONFIG_MIN_VERSION",
    "WorkspaceReconciler",
    "config_items",
    "has_json_config",
    "setup",
]

CONTROLLER_NAME: Final = "workspace-controller"
READY: Final = "Ready"
STALLED: Final = "Stalled"
# The Go operator's timings: connect within 5 s, retry an unreachable agent after 5 s.
CONNECT_TIMEOUT: Final = 5.0
REQUEUE_CONNECTION: Final = 5.0
REQUEUE_MIGRATION: Final = 5.0
# An agent that answered but refused (e.g. Unauthenticated: its TokenReview failed) is asked again
# after this long; the agent caches a failed TokenReview for a minute anyway.
REQUEUE_REFUSED: Final = 30.0
# A backstop while waiting on the pod: pod and StatefulSet events are what normally drive it.
REQUEUE_WAITING: Final = 60.0
# The StatefulSet controller creates a pod within this after an apply; only later is a missing pod
# worth a dry run (an API write) to learn why it was refused.
POD_CREATION_GRACE: Final = 5.0
MEMORY_ENTRIES: Final = 4096  # StatefulSet apply times kept (_remember)
# The status fields this controller owns.
STATUS_FIELDS: Final = ("observedGeneration", "conditions", "address", "pulumiVersion")
# Per call to the agent once connected (SelectStack, SetAllConfig...); Install may fetch plugins.
RPC_TIMEOUT: Final = 60.0
INSTALL_TIMEOUT: Final = 600.0
JSON_CONFIG_MIN_VERSION: Final = (3, 202, 0)
_MESSAGE_MAX: Final = 4096
_IMMUTABLE_MESSAGE: Final = "updates to statefulset spec for fields other than"

log = structlog.get_logger("pko.controllers.workspace.reconciler")


@dataclass(frozen=True, slots=True)
class _Finding:
    """What one reconcile concluded: the Ready condition, and Stalled when only the user can help."""

    reason: str
    message: str
    ready: bool = False
    stalled: bool = False


def _short(message: str) -> str:
    return message if len(message) <= _MESSAGE_MAX else message[: _MESSAGE_MAX - 3] + "..."


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(str(exc.body)).get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason or exc)


def has_json_config(spec: WorkspaceSpec) -> bool:
    """Whether a stack uses structured config (needs Pulumi CLI >= 3.202.0), as the Go operator checks."""
    for stack in spec.stacks or []:
        for item in stack.config or []:
            if item.value is not None and not isinstance(item.value, str):
                return True
            if item.value_from is not None and item.value_from.json_:
                return True
    return False


def _version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", version.strip())
    return tuple(int(p) for p in match.groups()) if match else None


def config_items(stack: Any) -> list[pb.ConfigItem]:
    """A Workspace stack's config as the agent's ConfigItems (the Go operator's marshalConfigItem)."""
    items = []
    for item in stack.config or []:
        value: Any = item.value
        if item.path and value is not None and not isinstance(value, str):
            raise ValueError(
                "path=true is incompatible with structured values (objects, arrays, etc.) "
                f"for key {item.key!r}"
            )
        out = pb.ConfigItem(key=item.key, path=item.path, secret=item.secret)
        if value is not None:
            out.value = Value.from_dict(value)
        if item.value_from is not None:
            vf = item.value_from
            source = pb.ConfigValueFrom(json=vf.json_)
            if vf.env:
                source.env = vf.env
            elif vf.path:
                source.path = vf.path
            out.value_from = source
        items.append(out)
    return items


class WorkspaceReconciler:
    """Reconciles one Workspace key (see the module docstring)."""

    def __init__(
        self,
        manager: Manager,
        options: ControllerOptions | None = None,
        *,
        tokens: TokenSource | None = None,
    ) -> None:
        self.options = options = options or ControllerOptions()
        self.workspaces = manager.informer(WORKSPACES)
        self.statefulsets = manager.informer(STATEFULSETS, label_selector=WORKSPACE_SELECTOR)
        self.services = manager.informer(SERVICES, label_selector=WORKSPACE_SELECTOR)
        self.pods = manager.informer(PODS, label_selector=WORKSPACE_SELECTOR)
        self.events = manager.events
        self.tokens = tokens or options.operator_tokens(manager)
        api, request_timeout = manager.api, manager.options.kube_api_timeout
        self.workspace_client = ResourceClient(api, WORKSPACES, request_timeout=request_timeout)
        self.statefulset_client = ResourceClient(api, STATEFULSETS, request_timeout=request_timeout)
        self.service_client = ResourceClient(api, SERVICES, request_timeout=request_timeout)
        self.pod_client = ResourceClient(api, PODS, request_timeout=request_timeout)
        self.core = CoreV1Api(api)
        # When this controller last applied each Workspace's StatefulSet (by Workspace uid).
        self._sts_applied: OrderedDict[str, float] = OrderedDict()
        self.status_writer = StatusWriter(
            self.workspaces,
            FIELD_MANAGER_WORKSPACE_STATUS,
            STATUS_FIELDS,
            client=self.workspace_client,
            force=True,
        )
        self.service_applier = DigestApplier(
            self.services, FIELD_MANAGER, client=self.service_client, force=True
        )
        self.statefulset_applier = DigestApplier(
            self.statefulsets, FIELD_MANAGER, client=self.statefulset_client, force=True
        )

    # --- the reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        ws = self.workspaces.latest(key)
        if ws is None:
            return Result.done()
        if (ws.get("metadata") or {}).get("deletionTimestamp"):
            await self._write_status(
                ws, _Finding("Deleting", "Workspace is being deleted"), keep_stalled=True
            )
            return Result.done()
        try:
            spec = parse_spec(ws)
            desired_svc = desired_service(ws, spec)
            desired_sts = desired_statefulset(ws, spec, self.options)
        except SpecInvalid as exc:
            await self._write_status(ws, _Finding("SpecInvalid", f"invalid spec: {exc}", stalled=True))
            return Result.done()
        finding, result, address, version = await self._converge(ws, spec, desired_svc, desired_sts)
        await self._write_status(ws, finding, address=address, pulumi_version=version)
        return result

    async def _converge(
        self, ws: Obj, spec: WorkspaceSpec, desired_svc: Obj, desired_sts: Obj
    ) -> tuple[_Finding, Result, str | None, str | None]:
        """Objects, rollout, pod, agent: the first thing not in order decides the finding."""
        meta = ws["metadata"]
        name, namespace = str(meta["name"]), str(meta["namespace"])
        version: str | None = (ws.get("status") or {}).get("pulumiVersion")
        waiting = Result.requeue_after(REQUEUE_WAITING)

        cached_svc = self.services.indexer.get_by_key(object_key(namespace, statefulset_name(name)))
        if self.service_applier.needed(desired_svc, cached_svc):
            try:
                await self.service_applier.apply(desired_svc)
            except ApiException as exc:
                if api_error_status(exc) != 422:
                    raise
                return (
                    _Finding("SpecInvalid", _short(_api_message(exc)), stalled=True),
                    Result.done(),
                    None,
                    version,
                )

        sts = self.statefulsets.indexer.get_by_key(object_key(namespace, statefulset_name(name)))
        if sts is not None:
            owner = controller_of(sts)
            if owner is not None and owner.get("uid") != meta.get("uid"):
                message = (
                    f"Waiting for the StatefulSet {statefulset_name(name)} of a previous Workspace to go"
                )
                return (
                    _Finding("RollingUpdate", message),
                    Result.requeue_after(REQUEUE_MIGRATION),
                    None,
                    version,
                )
            changed = immutable_fields_changed(sts, desired_sts)
            if changed:
                return (
                    await self._migrate(ws, sts, changed),
                    Result.requeue_after(REQUEUE_MIGRATION),
                    None,
                    version,
                )
        if self.statefulset_applier.needed(desired_sts, sts):
            refused = await self._pod_refusal(desired_sts)
            if refused is not None and refused[0] == 422:
                return _Finding("SpecInvalid", _short(refused[1]), stalled=True), Result.done(), None, version
            try:
                sts = await self.statefulset_applier.apply(desired_sts)
                _remember(self._sts_applied, str(meta.get("uid")), time.monotonic())
            except ApiException as exc:
                if api_error_status(exc) != 422:
                    raise
                message = _api_message(exc)
                if sts is not None and _IMMUTABLE_MESSAGE in message:
                    finding = await self._migrate(ws, sts, ["spec"])
                    return finding, Result.requeue_after(REQUEUE_MIGRATION), None, version
                return _Finding("SpecInvalid", _short(message), stalled=True), Result.done(), None, version
        assert sts is not None

        # The rollout, as the StatefulSet controller reports it.
        sts_status = sts.get("status") or {}
        rolling = _Finding("RollingUpdate", "Waiting for the statefulset to be updated")
        pod_key = object_key(namespace, pod_name(name))
        pod = self.pods.latest(pod_key)
        if pod is None:
            # A refused pod shows only in the StatefulSet's Events (and its status stays
            # unobserved): ask the apiserver why, by a dry run, once the StatefulSet controller
            # has had time to create it (a pod it creates wakes us before then).
            applied = self._sts_applied.get(str(meta.get("uid")))
            grace = POD_CREATION_GRACE - (time.monotonic() - applied) if applied is not None else 0.0
            if grace > 0:
                waiting = Result.requeue_after(grace)
            else:
                refused = await self._pod_refusal(desired_sts)
                if refused is not None:
                    return _Finding("PodCreationFailed", _short(refused[1])), waiting, None, version
        if int(sts_status.get("observedGeneration") or 0) < int(sts["metadata"].get("generation") or 0):
            return rolling, waiting, None, version
        if pod is None:
            return (
                _Finding("WaitingForReplicas", "Waiting for the workspace pod to be available"),
                waiting,
                None,
                version,
            )
        update_revision = sts_status.get("updateRevision")
        pod_revision = (pod["metadata"].get("labels") or {}).get(REVISION_LABEL)
        if update_revision and pod_revision != update_revision:
            # The StatefulSet controller replaces it, ready or not: with podManagementPolicy
            # Parallel it does not wait for an old pod that never became ready (Go issue 801).
            return rolling, waiting, None, version
        diagnosis: PodDiagnosis | None = diagnose_pod(pod)
        if diagnosis is not None:
            result = Result.done() if diagnosis.stalled else waiting
            return (
                _Finding(diagnosis.reason, _short(diagnosis.message), stalled=diagnosis.stalled),
                result,
                None,
                version,
            )

        # The pod is Ready: reach its agent.
        address = resolve_address(
            name,
            namespace,
            mode=self.options.workspace_address_mode,
            pod=pod,
            static=self.options.workspace_static_address,
        )
        if address is None:
            return (
                _Finding("WaitingForReplicas", "Waiting for the workspace pod's IP"),
                waiting,
                None,
                version,
            )
        if (pod["metadata"].get("annotations") or {}).get(ANNOTATION_INITIALIZED) == "true" and version:
            return _Finding("Succeeded", "", ready=True), Result.done(), address, version
        finding, result, version = await self._initialize(ws, spec, pod, address, version)
        return finding, result, address if finding.ready else None, version

    # --- steps -------------------------------------------------------------------------------

    async def _migrate(self, ws: Obj, sts: Obj, fields: Iterable[str]) -> _Finding:
        """Delete a StatefulSet whose immutable fields must change; the next reconcile recreates it."""
        meta = sts["metadata"]
        try:
            await self.statefulset_client.delete(
                meta["name"], meta["namespace"], uid=meta.get("uid"), propagation_policy="Background"
            )
        except ApiException as exc:
            if api_error_status(exc) not in (404, 409):
                raise
        what = ", ".join(fields)
        log.info("replacing the workspace statefulset to update an immutable field", fields=what)
        self.events.event(ws, "Warning", "Migrated", "Replaced the workspace statefulset")
        return _Finding("RollingUpdate", f"Replacing the statefulset to change {what}")

    async def _pod_refusal(self, sts: Obj) -> tuple[int, str] | None:
        """Why the apiserver would refuse the StatefulSet's pod (HTTP status, message), by a dry-run create.

        The StatefulSet API accepts templates its pods fail (a mount of an undeclared volume, a
        container without an image), and admission (a missing ServiceAccount, Pod Security) only
        speaks when the pod is created; the StatefulSet controller then only emits Events. A
        dry run gives the user the apiserver's own words without creating anything.
        """
        template = sts["spec"]["template"]
        meta = sts["metadata"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**copy.deepcopy(template.get("metadata") or {}), "name": f"{meta['name']}-0"},
            "spec": copy.deepcopy(template["spec"]),
        }
        try:
            await self.core.create_namespaced_pod(meta["namespace"], cast(Any, pod), dry_run="All")
        except ApiException as exc:
            if exc.status in (409, 404):  # a pod of that name exists: it was valid; or the namespace is going
                return None
            if exc.status in (400, 403, 422):
                return int(exc.status), _api_message(exc)
            log.warning("dry-run of the workspace pod failed", status=exc.status, reason=exc.reason)
        return None

    async def _initialize(
        self, ws: Obj, spec: WorkspaceSpec, pod: Obj, address: str, version: str | None
    ) -> tuple[_Finding, Result, str | None]:
        meta = ws["metadata"]
        name, namespace = str(meta["name"]), str(meta["namespace"])
        try:
            async with AgentClient(
                address,
                audience(name, namespace),
                self.tokens,
                connect_timeout=CONNECT_TIMEOUT,
                retry_budget=CONNECT_TIMEOUT,
                call_timeout=RPC_TIMEOUT,
            ) as agent:
                try:
                    version = await asyncio.wait_for(agent.pulumi_version(), CONNECT_TIMEOUT * 3)
                except (AgentError, TokenError, TimeoutError, OSError) as exc:
                    return (*self._unreachable(ws, exc), version)
                incompatible = _incompatible(spec, version)
                if incompatible is not None:
                    message = f"Pulumi CLI version {version} is too old for JSON configuration support"
                    self.events.event(ws, "Warning", "StackInitializationFailure", message)
                    return incompatible, Result.done(), version

                await self._write_status(
                    ws, _Finding("Installing", "Installing packages and plugins required by the program")
                )
                try:
                    await asyncio.wait_for(agent.install(), INSTALL_TIMEOUT)
                except (AgentError, TimeoutError) as exc:
                    message = _short(_error_message(exc))
                    self.events.event(ws, "Warning", "InstallationFailure", message)
                    return _Finding("InstallationFailed", message, stalled=True), Result.done(), version

                await self._write_status(
                    ws, _Finding("Initializing", "Initializing and selecting a Pulumi stack")
                )
                for stack in spec.stacks or []:
                    try:
                        await self._init_stack(agent, stack)
                    except (AgentError, TimeoutError, ValueError) as exc:
                        message = _short(_error_message(exc))
                        event = f"Failed to initialize stack {stack.name!r}: {message}"
                        self.events.event(ws, "Warning", "StackInitializationFailure", event)
                        return _Finding("InitializationFailed", message, stalled=True), Result.done(), version
        except (AgentError, TokenError, OSError) as exc:
            return (*self._unreachable(ws, exc), version)

        pod_meta = pod["metadata"]
        body = {"metadata": {"annotations": {ANNOTATION_INITIALIZED: "true"}, "uid": pod_meta.get("uid")}}
        try:
            self.pods.wrote(
                await self.pod_client.patch(pod_meta["name"], body, namespace=pod_meta["namespace"])
            )
        except ApiException as exc:
            if api_error_status(exc) not in (404, 409, 422):
                raise
            # The pod went (or was replaced) meanwhile: its successor initializes from scratch.
            return _Finding("WaitingForReplicas", "The workspace pod was replaced"), Result.requeue(), version
        log.info("workspace pod initialized", pod=pod_meta["name"], pulumi_version=version)
        self.events.event(ws, "Normal", "Initialized", f"Initialized workspace pod {pod_meta['name']!r}")
        return _Finding("Succeeded", "", ready=True), Result.done(), version

    async def _init_stack(self, agent: AgentClient, stack: Any) -> None:
        await asyncio.wait_for(
            agent.select_stack(stack.name, create=stack.create, secrets_provider=stack.secrets_provider),
            RPC_TIMEOUT,
        )
        if stack.config:
            await asyncio.wait_for(agent.set_all_config(config_items(stack)), RPC_TIMEOUT)
        if stack.environment:
            await asyncio.wait_for(agent.add_environments(list(stack.environment)), RPC_TIMEOUT)

    def _unreachable(self, ws: Obj, exc: BaseException) -> tuple[_Finding, Result]:
        """PulumiVersion failed: ``ConnectionFailed`` (retry in 5 s) when the agent could not be
        reached, else the gRPC code's name as the Go operator reports it (e.g. ``Unauthenticated``:
        the agent's TokenReview failed, no system:auth-delegator binding; the pod is kept for
        diagnosis), asked again later."""
        message = _short(_error_message(exc))
        self.events.event(ws, "Warning", "ConnectionFailure", message)
        if isinstance(exc, AgentError) and exc.code != "UNAVAILABLE":
            delay = REQUEUE_CONNECTION if exc.transient else REQUEUE_REFUSED
            return _Finding(exc.reason, message), Result.requeue_after(delay)
        if isinstance(exc, TokenError):
            delay = REQUEUE_CONNECTION if exc.transient else REQUEUE_REFUSED
            return _Finding(exc.reason, message), Result.requeue_after(delay)
        return _Finding("ConnectionFailed", message), Result.requeue_after(REQUEUE_CONNECTION)

    # --- status ------------------------------------------------------------------------------

    async def _write_status(
        self,
        ws: Obj,
        finding: _Finding,
        *,
        address: str | None = None,
        pulumi_version: str | None = None,
        keep_stalled: bool = False,
    ) -> None:
        """Apply the status this controller owns, unless the cached one already says it."""
        meta = ws["metadata"]
        current: Obj = ws.get("status") or {}
        generation = int(meta.get("generation") or 0)
        conditions: list[Obj] | None = current.get("conditions")
        status_: ConditionStatus = "True" if finding.ready else "False"
        conditions = set_condition(conditions, READY, status_, finding.reason, finding.message, generation)
        if finding.stalled:
            conditions = set_condition(
                conditions, STALLED, "True", finding.reason, finding.message, generation
            )
        elif not keep_stalled:
            conditions = remove_condition(conditions, STALLED)
        status: Obj = {"observedGeneration": generation, "conditions": conditions}
        if address:
            status["address"] = address
        version = pulumi_version or current.get("pulumiVersion")
        if version:
            status["pulumiVersion"] = version
        try:
            updated = await self.status_writer.write(ws, status)
        except ApiException as exc:
            if api_error_status(exc) == 404:
                return
            raise
        if updated is None:
            return  # already there (in the cache, or in our own write not yet watched back)
        # Later steps of this reconcile compare against what was just written.
        ws["status"] = updated.get("status") or status
        ready = get_condition(conditions, READY) or {}
        log.info(
            "workspace status", workspace=f"{meta['namespace']}/{meta['name']}", reason=ready.get("reason")
        )


def _remember(memory: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Bounded: a forgotten entry costs one redundant write at most."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > MEMORY_ENTRIES:
        memory.popitem(last=False)


def _incompatible(spec: WorkspaceSpec, version: str) -> _Finding | None:
    if not has_json_config(spec):
        return None
    parsed = _version_tuple(version)
    if parsed is None:
        return _Finding(
            "IncompatibleConfiguration", f"Failed to parse Pulumi version {version!r}", stalled=True
        )
    if parsed < JSON_CONFIG_MIN_VERSION:
        minimum = ".".join(str(p) for p in JSON_CONFIG_MIN_VERSION)
        message = f"Pulumi CLI version {version} does not support JSON configuration, require >= v{minimum}"
        return _Finding("IncompatibleConfiguration", message, stalled=True)
    return None


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, AgentError):
        return exc.message or str(exc)
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the workspace agent"
    return str(exc) or type(exc).__name__


def _pod_workspace(pod: Obj) -> list[str]:
    """A workspace pod's events go to its Workspace (named by the pod's label)."""
    meta = pod.get("metadata") or {}
    workspace = (meta.get("labels") or {}).get(WORKSPACE_NAME_LABEL)
    return [object_key(meta.get("namespace"), workspace)] if workspace else []


def setup(manager: Manager, options: ControllerOptions | None = None, **kwargs: Any) -> WorkspaceReconciler:
    """Declare the workspace controller: Workspaces, and the workspace StatefulSets, Services and Pods."""
    reconciler = WorkspaceReconciler(manager, options, **kwargs)
    (
        manager.controller(CONTROLLER_NAME, reconciler)
        .for_(WORKSPACES, predicate=or_(generation_changed, deletion_started))
        .owns(STATEFULSETS, label_selector=WORKSPACE_SELECTOR)
        .owns(SERVICES, label_selector=WORKSPACE_SELECTOR)
        .watches(PODS, _pod_workspace, label_selector=WORKSPACE_SELECTOR)
    )
    return reconciler
