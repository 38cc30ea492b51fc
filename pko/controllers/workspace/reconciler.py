"""The Workspace reconciler: a StatefulSet (one pod running the agent) and a headless Service per
Workspace, and a ``Ready`` condition that says what a user can do when the pod does not come up.

One reconcile: read, decide, act. It reads only caches (Workspaces, and the StatefulSets, Services
and Pods labelled ``auto.pulumi.com/component=workspace``) into an
:class:`~pko.controllers.workspace.plan.Observed`; the pure
:func:`~pko.controllers.workspace.plan.decide` says what to write, in order, and the status and
``Result`` that follow; ``_act`` is the one place that carries it out (API writes, the dry run,
the agent). What it decides:

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
   unschedulable pod... Pod and StatefulSet events drive this; nothing polls. A pod bound to a
   node but not ready (or terminating) has its Node read, one GET, never a list or a watch
   (:func:`~pko.controllers.workspace.workloads.diagnose_node`): a node that stopped reporting
   holds a StatefulSet pod forever, so the Workspace says ``NodeLost`` (``NodeNotReady``), Stalled
   after a minute, with the command that lets Kubernetes start the pod elsewhere. A pod its
   kubelet is still starting has no Node read for its first 30 s
   (:func:`~pko.controllers.workspace.workloads.node_check_after`); the dry run's answer stands
   for the same StatefulSet for a minute (:func:`~pko.controllers.workspace.plan.decide`).
4. A Ready pod not yet ``auto.pulumi.com/initialized`` is initialized through its agent (token
   audience ``<ws>.<ns>``, a TokenRequest for the operator's own ServiceAccount): PulumiVersion,
   the JSON-config version check, Install, then each of ``spec.stacks`` (SelectStack with the
   stack's settings file reset to the program's, SetAllConfig, AddEnvironments); then the pod is
   annotated, with the hash of those ``stacks`` (a new pod initializes again). ``stacks`` are not
   part of the pod's revision: when only they change (a config change), the live agent gets them
   again the same way, without Install, and no pod is replaced.
   Reasons and events are the Go operator's (``ConnectionFailed`` with a 5 s requeue, the gRPC
   code such as ``Unauthenticated``, ``Installing``, ``InstallationFailed``, ``Initializing``,
   ``InitializationFailed``, ``IncompatibleConfiguration``, then ``Succeeded``).

Status goes by server-side apply of ``/status`` as ``pulumi-kubernetes-operator/workspace-status``
and only when it differs from the cached one; a starting pod's progress message replacing another
waits until the one written has stood 5 s (:func:`~pko.controllers.workspace.status.held_for`).
``Stalled`` always reflects this reconcile's finding (it goes away as soon as the problem does),
except while deleting.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import marshal
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
import structlog

from pko.agentclient import AgentClient, AgentError, audience, resolve_address
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from pko.api.update import CONDITION_COMPLETE
from pko.api.workspace import WorkspaceSpec
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import (
    FIELD_MANAGER,
    FIELD_MANAGER_WORKSPACE_STATUS,
    UPDATES,
    UPDATES_BY_WORKSPACE,
    WORKSPACE_NAME_LABEL,
    WORKSPACE_SELECTOR,
    WORKSPACES,
    index_updates_by_workspace,
)
from pko.controllers.update.status import is_running
from pko.controllers.workspace import plan as wp
from pko.controllers.workspace.plan import Failure, Observed, Plan, Write, decide, refused
from pko.controllers.workspace.status import READY, STATUS_FIELDS, desired_status, held_for
from pko.controllers.workspace.workloads import (
    ANNOTATION_INITIALIZED,
    ANNOTATION_STACKS_HASH,
    NodeReading,
    SpecInvalid,
    desired_service,
    desired_statefulset,
    parse_spec,
    pod_name,
    stacks_hash,
    statefulset_name,
)
from pko.machinery.conditions import get_condition
from pko.machinery.controller import Result
from pko.machinery.executor import Expected, execute
from pko.machinery.kubeclient import ApiException
from pko.machinery.manager import Manager
from pko.machinery.predicates import condition_became, deletion_started, generation_changed, or_
from pko.machinery.resource import PODS, SERVICES, STATEFULSETS, Obj, Resource, api_error_status
from pko.machinery.store import object_key
from pko.machinery.writes import DigestApplier, StatusWriter
from pko.tokens import TokenError, TokenSource

__all__ = ["CONTROLLER_NAME", "WorkspaceReconciler", "config_items", "setup"]

CONTROLLER_NAME: Final = "workspace-controller"
# The Go operator's timing: connect within 5 s.
CONNECT_TIMEOUT: Final = 5.0
MEMORY_ENTRIES: Final = 4096  # StatefulSet apply times kept (_remember)
# The last Workspaces' desired Service and StatefulSet, encoded (_desired_objects): a Workspace is
# reconciled a dozen times while its pod starts, for pod and StatefulSet changes, its own unchanged.
DESIRED_ENTRIES: Final = 256
# Per call to the agent once connected (SelectStack, SetAllConfig...); Install may fetch plugins.
RPC_TIMEOUT: Final = 60.0
INSTALL_TIMEOUT: Final = 600.0
# A Service or StatefulSet this process applied stands for the cached one, until the informer has it,
# this long at most: a reconcile in between (the other object's event) would apply it again, and a
# StatefulSet's apply comes with a pod dry run (the 20-Stack deploy benchmark: 1.1 to 1.3 each).
UNSEEN_WINDOW: Final = 10.0
# Read one at a time (CheckNode), never listed nor watched.
NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)

log = structlog.get_logger("pko.controllers.workspace.reconciler")


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(str(exc.body)).get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason or exc)


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


@dataclass(slots=True)
class _Session:
    """What one reconcile's writes share: the agent connection AskVersion opens, closed with
    ``exits`` once the plan is carried out."""

    exits: contextlib.AsyncExitStack
    agent: AgentClient | None = None

    def connected(self) -> AgentClient:
        assert self.agent is not None, "the plan asks the agent's version before anything else"
        return self.agent


# The failures each write expects (the rest propagate): see plan.refused, which plans from them.
_AGENT_FAILURES: Final = (AgentError, TokenError, TimeoutError, OSError)
_EXPECTED: Final[Expected] = {
    wp.ApplyService: (ApiException,),
    wp.ApplyStatefulSet: (ApiException,),
    wp.AnnotateInitialized: (ApiException,),
    wp.AskVersion: _AGENT_FAILURES,
    wp.Install: _AGENT_FAILURES,
    wp.InitStack: (*_AGENT_FAILURES, ValueError),
}


def _failure(exc: BaseException) -> Failure:
    """A write's expected exception (``_EXPECTED``) as data for
    :func:`~pko.controllers.workspace.plan.refused`."""
    if isinstance(exc, ApiException):
        return Failure("api", _api_message(exc), status=api_error_status(exc) or 0)
    if isinstance(exc, AgentError):
        message = exc.message or str(exc)
        return Failure("agent", message, code=exc.code, reason=exc.reason, transient=exc.transient)
    if isinstance(exc, TokenError):
        return Failure("token", str(exc) or type(exc).__name__, reason=exc.reason, transient=exc.transient)
    if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
        return Failure("timeout", "timed out waiting for the workspace agent")
    if isinstance(exc, OSError):
        return Failure("network", str(exc) or type(exc).__name__)
    return Failure("value", str(exc) or type(exc).__name__)


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
        self.updates = manager.informer(UPDATES, indexers={UPDATES_BY_WORKSPACE: index_updates_by_workspace})
        self.events = manager.events
        self.tokens = tokens or options.operator_tokens(manager)
        self.workspace_client = manager.client(WORKSPACES)
        self.statefulset_client = manager.client(STATEFULSETS)
        self.service_client = manager.client(SERVICES)
        self.pod_client = manager.client(PODS)
        self.node_client = manager.client(NODES)
        self._node_forbidden = False  # a 403 on a Node GET was logged (once: an older ClusterRole)
        # The pod dry run (the one request outside a resource client), bounded like their requests.
        self.api = manager.api
        self.request_timeout = manager.options.kube_api_timeout
        # When this controller last applied each Workspace's StatefulSet (by Workspace uid).
        self._sts_applied: OrderedDict[str, float] = OrderedDict()
        # By "<resource>/<Workspace uid>": (when, the object as applied) until its informer has it.
        self._unseen: OrderedDict[str, tuple[float, Obj]] = OrderedDict()
        # By Workspace uid: the last dry run of its pod (digest, when, answer): plan.PodCheck.
        self._pod_checks: OrderedDict[str, tuple[str, float, tuple[int, str] | None]] = OrderedDict()
        # When this controller last wrote each Workspace's status (by uid): status.held_for.
        self._status_written: OrderedDict[str, float] = OrderedDict()
        # By Workspace uid: (what the desired objects are built from, the objects), both marshalled.
        self._desired: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()
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
        return await self._act(ws, decide(self._observe(ws)))

    # --- reading (caches and this process's memory only) -------------------------------------

    def _observe(self, ws: Obj) -> Observed:
        meta = ws["metadata"]
        if meta.get("deletionTimestamp"):
            return Observed(ws)
        name, namespace = str(meta["name"]), str(meta["namespace"])
        try:
            spec = parse_spec(ws)
            desired_svc, desired_sts = self._desired_objects(ws, spec)
        except SpecInvalid as exc:
            return Observed(ws, invalid=str(exc))
        objects = object_key(namespace, statefulset_name(name))
        uid = str(meta.get("uid"))
        service = self._cached_or_applied(self.services.latest(objects), f"services/{uid}")
        sts = self._cached_or_applied(self.statefulsets.latest(objects), f"statefulsets/{uid}")
        pod = self.pods.latest(object_key(namespace, pod_name(name)))
        applied = self._sts_applied.get(uid)
        checked = self._pod_checks.get(uid)
        pod_check = None
        if checked is not None:
            pod_check = wp.PodCheck(checked[0], time.monotonic() - checked[1], checked[2])
        address = None
        if pod is not None:
            address = resolve_address(
                name,
                namespace,
                mode=self.options.workspace_address_mode,
                pod=pod,
                static=self.options.workspace_static_address,
            )
        return Observed(
            ws,
            spec=spec,
            statefulset=sts,
            pod=pod,
            desired_service=desired_svc,
            desired_statefulset=desired_sts,
            apply_service=self.service_applier.needed(desired_svc, service),
            apply_statefulset=self.statefulset_applier.needed(desired_sts, sts),
            since_apply=time.monotonic() - applied if applied is not None else None,
            address=address,
            stacks_hash=stacks_hash(ws.get("spec") or {}),
            now=datetime.now(UTC),
            pod_check=pod_check,
            running_updates=tuple(
                sorted(
                    str(u["metadata"]["name"])
                    for u in self.updates.indexer.by_index(UPDATES_BY_WORKSPACE, object_key(namespace, name))
                    if is_running(u)
                )
            ),
        )

    def _cached_or_applied(self, cached: Obj | None, slot: str) -> Obj | None:
        """``cached`` (the informer's, or its own later write of it), or the object as this process
        created it within :data:`UNSEEN_WINDOW` while the informer has not delivered it yet (the
        informer's read-your-writes covers only objects it holds)."""
        if cached is not None:
            self._unseen.pop(slot, None)
            return cached
        kept = self._unseen.get(slot)
        return kept[1] if kept is not None and time.monotonic() - kept[0] < UNSEEN_WINDOW else None

    def _desired_objects(self, ws: Obj, spec: WorkspaceSpec) -> tuple[Obj, Obj]:
        """:func:`desired_service` and :func:`desired_statefulset` of ``ws`` (fresh objects), built
        again only when what they read of it changed: its identity, labels and spec (the options are
        fixed); otherwise decoded from what the last build left."""
        meta = ws["metadata"]
        uid = str(meta.get("uid"))
        identity = (ws.get("apiVersion"), ws.get("kind"), meta.get("name"), meta.get("namespace"), uid)
        try:
            inputs = marshal.dumps((identity, meta.get("labels"), ws.get("spec")))
        except ValueError:  # not decoded JSON: not kept
            return desired_service(ws, spec), desired_statefulset(ws, spec, self.options)
        kept = self._desired.get(uid)
        if kept is not None and kept[0] == inputs:
            self._desired.move_to_end(uid)
            service, statefulset = marshal.loads(kept[1])
            return service, statefulset
        service, statefulset = desired_service(ws, spec), desired_statefulset(ws, spec, self.options)
        _remember(self._desired, uid, (inputs, marshal.dumps((service, statefulset))), DESIRED_ENTRIES)
        return service, statefulset

    # --- acting: the one place that writes -----------------------------------------------------

    async def _act(self, ws: Obj, plan: Plan) -> Result:
        """Carry out ``plan`` (:func:`~pko.machinery.executor.execute`: its writes, what ``then``
        plans from the last one's answer, and :func:`refused` for a failure a write expects,
        ``_EXPECTED``), then write the status it leads to."""
        async with contextlib.AsyncExitStack() as exits:
            session = _Session(exits)
            plan = await execute(
                plan,
                lambda write: self._carry_out(ws, write, session),
                expected=_EXPECTED,
                failure_of=_failure,
                refused=refused,
                follow=lambda plan, answer: plan.then(answer) if plan.then is not None else None,
            )
        assert plan.finding is not None, "a plan without then ends with a finding"
        status = desired_status(
            ws, plan.finding, address=plan.address, version=plan.version, keep_stalled=plan.keep_stalled
        )
        written = self._status_written.get(str(ws["metadata"].get("uid")))
        since = time.monotonic() - written if written is not None else None
        hold = held_for(ws.get("status") or {}, status, since)
        if hold > 0:  # a progress message replacing another: written when the hold ends
            return wp.sooner(plan.result, hold)
        await self._write_status(ws, status)
        return plan.result

    async def _carry_out(self, ws: Obj, write: Write, session: _Session) -> Any:
        """One write; its answer (what ``then`` plans from)."""
        uid = str(ws["metadata"].get("uid"))
        if isinstance(write, wp.WriteStatus):
            await self._write_status(ws, desired_status(ws, write.finding))
        elif isinstance(write, wp.Emit):
            self.events.event(ws, write.type, write.reason, write.message)
        elif isinstance(write, wp.ApplyService):
            applied = await self.service_applier.apply(write.body)
            _remember(self._unseen, f"services/{uid}", (time.monotonic(), applied), DESIRED_ENTRIES)
        elif isinstance(write, wp.CheckPod):
            refusal = await self._pod_refusal(write.statefulset)
            checked = (wp.digest_of(write.statefulset), time.monotonic(), refusal)
            _remember(self._pod_checks, uid, checked)
            return refusal
        elif isinstance(write, wp.CheckNode):
            return await self._read_node(write.name)
        elif isinstance(write, wp.ApplyStatefulSet):
            applied = await self.statefulset_applier.apply(write.body)
            _remember(self._sts_applied, uid, time.monotonic())
            _remember(self._unseen, f"statefulsets/{uid}", (time.monotonic(), applied), DESIRED_ENTRIES)
            return applied
        elif isinstance(write, wp.DeleteStatefulSet):
            self._unseen.pop(f"statefulsets/{uid}", None)
            await self._delete_statefulset(write.statefulset, write.fields)
        elif isinstance(write, wp.AskVersion):
            meta = ws["metadata"]
            client = AgentClient(
                write.address,
                audience(str(meta["name"]), str(meta["namespace"])),
                self.tokens,
                connect_timeout=CONNECT_TIMEOUT,
                retry_budget=CONNECT_TIMEOUT,
                call_timeout=RPC_TIMEOUT,
            )
            session.agent = await session.exits.enter_async_context(client)
            return await asyncio.wait_for(session.connected().pulumi_version(), CONNECT_TIMEOUT * 3)
        elif isinstance(write, wp.Install):
            await asyncio.wait_for(session.connected().install(), INSTALL_TIMEOUT)
        elif isinstance(write, wp.InitStack):
            await self._init_stack(session.connected(), write.stack)
        elif isinstance(write, wp.AnnotateInitialized):
            await self._annotate_initialized(write.pod, write.version, write.stacks_hash)
        return None

    async def _delete_statefulset(self, sts: Obj, fields: tuple[str, ...]) -> None:
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
            await self.api.call_json(
                "POST",
                PODS.collection_path(meta["namespace"]),
                query=[("dryRun", "All")],
                body=pod,
                client_timeout=aiohttp.ClientTimeout(total=self.request_timeout),
            )
        except ApiException as exc:
            if exc.status in (409, 404):  # a pod of that name exists: it was valid; or the namespace is going
                return None
            if exc.status in (400, 403, 422):
                return int(exc.status), _api_message(exc)
            log.warning("dry-run of the workspace pod failed", status=exc.status, reason=exc.reason)
        return None

    async def _read_node(self, name: str) -> NodeReading | None:
        """The workspace pod's Node as :func:`~pko.controllers.workspace.workloads.diagnose_node`
        needs it; None when it could not be read (no ``get nodes`` grant, the API unreachable): the
        pod's own diagnosis then stands, as before the operator could read Nodes."""
        try:
            node = await self.node_client.get_or_none(name)
        except ApiException as exc:
            status = api_error_status(exc)
            if status != 403 or not self._node_forbidden:
                log.warning("could not read the workspace pod's node", node=name, status=status)
            self._node_forbidden = self._node_forbidden or status == 403
            return None
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            log.warning("could not read the workspace pod's node", node=name, error=repr(exc))
            return None
        return NodeReading.of(node, datetime.now(UTC))

    async def _init_stack(self, agent: AgentClient, stack: Any) -> None:
        await asyncio.wait_for(
            agent.select_stack(
                stack.name,
                create=stack.create,
                secrets_provider=stack.secrets_provider,
                reset_config=True,
                summary=False,
            ),
            RPC_TIMEOUT,
        )
        if stack.config:
            await asyncio.wait_for(agent.set_all_config(config_items(stack)), RPC_TIMEOUT)
        if stack.environment:
            await asyncio.wait_for(agent.add_environments(list(stack.environment)), RPC_TIMEOUT)

    async def _annotate_initialized(self, pod: Obj, version: str, stacks: str) -> None:
        pod_meta = pod["metadata"]
        annotations = {ANNOTATION_INITIALIZED: "true", ANNOTATION_STACKS_HASH: stacks}
        body = {"metadata": {"annotations": annotations, "uid": pod_meta.get("uid")}}
        self.pods.wrote(await self.pod_client.patch(pod_meta["name"], body, namespace=pod_meta["namespace"]))
        log.info("workspace pod initialized", pod=pod_meta["name"], pulumi_version=version)

    async def _write_status(self, ws: Obj, status: Obj) -> None:
        """Apply the status this controller owns, unless the cached one already says it."""
        try:
            updated = await self.status_writer.write(ws, status)
        except ApiException as exc:
            if api_error_status(exc) == 404:
                return
            raise
        if updated is None:
            return  # already there (in the cache, or in our own write not yet watched back)
        _remember(self._status_written, str(ws["metadata"].get("uid")), time.monotonic())
        # Later writes of this reconcile compare against what was just written.
        ws["status"] = updated.get("status") or status
        meta = ws["metadata"]
        ready = get_condition(status["conditions"], READY) or {}
        log.info(
            "workspace status", workspace=f"{meta['namespace']}/{meta['name']}", reason=ready.get("reason")
        )


def _remember(memory: OrderedDict[str, Any], key: str, value: Any, entries: int = MEMORY_ENTRIES) -> None:
    """Bounded: a forgotten entry costs one redundant write (or build) at most."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > entries:
        memory.popitem(last=False)


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
        # An Update's end lets the roll it held go on (plan.py ``_hold_roll``): to the Workspace it ran
        # in, the key the shared Updates-by-Workspace index computes.
        .watches(UPDATES, index_updates_by_workspace, predicate=condition_became(CONDITION_COMPLETE, "True"))
    )
    return reconciler
