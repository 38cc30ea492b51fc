"""What one Workspace reconcile decided: the writes to make, in order, the status they lead to and
when to look again (pure).

The reconciler reads (caches; this process's memory of when it applied the StatefulSet and of
its last pod dry run; the clock) into an :class:`Observed`, asks :func:`decide` for a
:class:`Plan` and carries it out in one place (``WorkspaceReconciler._act``), the only code that
writes or calls the agent. Where the rest
depends on a write's answer (the StatefulSet as applied, a dry run's refusal, the agent's Pulumi
version), a plan ends with ``then``: the pure function that plans the rest from that answer. A
write that fails in a way the user must hear about becomes a :class:`Failure`, and
:func:`refused` plans the rest from it (or says it is not ours to handle: the error propagates
and the controller retries with backoff). The status a finding leads to, and when it is written,
are :mod:`pko.controllers.workspace.status`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from pko.api.workspace import WorkspaceSpec
from pko.controllers.workspace.status import (
    JSON_CONFIG_MIN_VERSION,
    Finding,
    desired_status,
    has_json_config,
    incompatible,
)
from pko.controllers.workspace.workloads import (
    ANNOTATION_APPLIED_DIGEST,
    ANNOTATION_INITIALIZED,
    ANNOTATION_STACKS_HASH,
    REVISION_LABEL,
    NodeReading,
    PodDiagnosis,
    diagnose_node,
    diagnose_pod,
    immutable_fields_changed,
    node_check_after,
    serves_our_agent,
    statefulset_name,
)
from pko.machinery.controller import Result
from pko.machinery.events import Emit
from pko.machinery.objects import controller_of
from pko.machinery.resource import Obj

__all__ = [
    "JSON_CONFIG_MIN_VERSION",
    "AnnotateInitialized",
    "ApplyService",
    "ApplyStatefulSet",
    "AskVersion",
    "CheckNode",
    "CheckPod",
    "DeleteStatefulSet",
    "Emit",
    "Failure",
    "Finding",
    "InitStack",
    "Install",
    "Observed",
    "Plan",
    "PodCheck",
    "Write",
    "WriteStatus",
    "decide",
    "desired_status",
    "digest_of",
    "has_json_config",
    "refused",
    "sooner",
]

# Not Ready: the pod's new template waits for the operation running in the old one.
REASON_UPDATE_RUNNING: Final = "UpdateRunning"
# The Go operator's timings: retry an unreachable agent after 5 s, wait 5 s for a migration.
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
# A dry run's answer (PodCheck) stands this long for the same StatefulSet: the backstop's period.
POD_CHECK_REUSE: Final = REQUEUE_WAITING
# A live agent busy with an operation is asked again to take new stack settings after this long
# (the Stack controller changes the Workspace only between Updates, so this is rare).
REQUEUE_BUSY: Final = 5.0
MESSAGE_MAX: Final = 4096
_IMMUTABLE_MESSAGE: Final = "updates to statefulset spec for fields other than"


@dataclass(frozen=True, slots=True)
class PodCheck:
    """This process's last dry run of a Workspace's pod (CheckPod): of the StatefulSet whose applied
    digest is ``digest``, ``age`` seconds ago, and its answer."""

    digest: str
    age: float
    refusal: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    """What the reconcile read: the Workspace, its objects as cached and as desired, its pod."""

    workspace: Obj
    spec: WorkspaceSpec | None = None
    invalid: str | None = None  # why the spec cannot be built into objects
    statefulset: Obj | None = None
    pod: Obj | None = None
    desired_service: Obj = field(default_factory=dict)
    desired_statefulset: Obj = field(default_factory=dict)
    apply_service: bool = False  # the applier's digest rule says the Service needs an apply
    apply_statefulset: bool = False
    since_apply: float | None = None  # seconds since this process applied the StatefulSet
    address: str | None = None  # where the pod's agent answers (None: the pod has no IP yet)
    stacks_hash: str = ""  # workloads.stacks_hash of the spec: what the agent must be initialized with
    running_updates: tuple[str, ...] = ()  # the Updates whose operation runs in this pod now
    now: datetime | None = None  # the wall clock, for the pod's times (None: every grace is over)
    pod_check: PodCheck | None = None  # the last dry run of the pod, if this process made one


# --- writes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteStatus:
    """Apply a progress status now (the plan's final status is written after its writes)."""

    finding: Finding


@dataclass(frozen=True, slots=True)
class ApplyService:
    """Server-side apply the headless Service (stamped with its digest)."""

    body: Obj


@dataclass(frozen=True, slots=True)
class CheckPod:
    """Dry-run create the StatefulSet's pod. Answer: the apiserver's refusal ``(status, message)``
    or None (the StatefulSet API accepts templates whose pods admission refuses)."""

    statefulset: Obj


@dataclass(frozen=True, slots=True)
class CheckNode:
    """GET the Node ``name`` a not-ready workspace pod is bound to (one object, only while the pod
    waits: Nodes are too big and many to cache). Answer: a
    :class:`~pko.controllers.workspace.workloads.NodeReading`, or None when it could not tell."""

    name: str


@dataclass(frozen=True, slots=True)
class ApplyStatefulSet:
    """Server-side apply the StatefulSet (``existing``: as cached). Answer: the object as written."""

    body: Obj
    existing: Obj | None


@dataclass(frozen=True, slots=True)
class DeleteStatefulSet:
    """Delete a StatefulSet whose immutable ``fields`` must change (uid precondition); the next
    reconcile recreates it."""

    statefulset: Obj
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AskVersion:
    """Connect to the agent at ``address`` and ask its Pulumi CLI version. Answer: the version."""

    address: str


@dataclass(frozen=True, slots=True)
class Install:
    """The agent installs the program's packages and plugins."""


@dataclass(frozen=True, slots=True)
class InitStack:
    """The agent selects (or creates) one of ``spec.stacks`` with its settings file back as the
    program has it, then sets its config and environments: the whole of them, also on a live agent
    initialized before (a key removed from the spec goes, as it would from a new pod)."""

    stack: Any


@dataclass(frozen=True, slots=True)
class AnnotateInitialized:
    """Mark the pod initialized with the ``stacks`` of ``stacks_hash`` (uid precondition: a new pod
    initializes again)."""

    pod: Obj
    version: str
    stacks_hash: str = ""


Write = (
    WriteStatus
    | Emit
    | ApplyService
    | CheckPod
    | CheckNode
    | ApplyStatefulSet
    | DeleteStatefulSet
    | AskVersion
    | Install
    | InitStack
    | AnnotateInitialized
)


@dataclass(frozen=True, slots=True)
class Failure:
    """How a write failed, as data: an API refusal (``status``), an agent error (gRPC ``code``,
    ``reason``), a token that could not be minted, a timeout, a network error or a bad value."""

    kind: Literal["api", "agent", "token", "timeout", "network", "value"]
    message: str
    status: int = 0
    code: str = ""
    reason: str = ""
    transient: bool = False


@dataclass(slots=True)
class Plan:
    """Writes in order, then the status to write (``finding``; the pod's ``address`` once Ready,
    the agent's ``version``) and the ``Result``; or ``then``, planning the rest from the last
    write's answer."""

    writes: list[Write]
    finding: Finding | None = None
    result: Result = field(default_factory=Result.done)
    address: str | None = None
    version: str | None = None
    keep_stalled: bool = False
    then: Callable[[Any], Plan] | None = None


def _prepend(writes: list[Write], plan: Plan) -> Plan:
    plan.writes[:0] = writes
    return plan


def sooner(result: Result, seconds: float) -> Result:
    """``result``, or a requeue after ``seconds`` if that comes first."""
    if result.kind == "requeue" or (result.kind == "requeue_after" and result.delay <= seconds):
        return result
    return Result.requeue_after(seconds)


def short(message: str) -> str:
    """A message cut to what a condition carries."""
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


# --- deciding ----------------------------------------------------------------------------------


def decide(observed: Observed) -> Plan:
    """The whole decision: objects, rollout, pod, agent; the first thing not in order decides."""
    ws = observed.workspace
    meta = ws["metadata"]
    version: str | None = (ws.get("status") or {}).get("pulumiVersion")
    if meta.get("deletionTimestamp"):
        return Plan([], Finding("Deleting", "Workspace is being deleted"), keep_stalled=True)
    if observed.invalid is not None:
        return Plan([], Finding("SpecInvalid", f"invalid spec: {observed.invalid}", stalled=True))

    writes: list[Write] = []
    if observed.apply_service:
        writes.append(ApplyService(observed.desired_service))
    sts = observed.statefulset
    if sts is not None:
        owner = controller_of(sts)
        if owner is not None and owner.get("uid") != meta.get("uid"):
            message = (
                f"Waiting for the StatefulSet {statefulset_name(str(meta['name']))} of a previous "
                "Workspace to go"
            )
            finding = Finding("RollingUpdate", message)
            return Plan(writes, finding, Result.requeue_after(REQUEUE_MIGRATION), version=version)
        changed = immutable_fields_changed(sts, observed.desired_statefulset)
        if (changed or observed.apply_statefulset) and _holds(observed):
            return _prepend(writes, _hold_roll(observed.running_updates, version))
        if changed:
            return _prepend(writes, _migrate(sts, tuple(changed), version))
    if observed.apply_statefulset:
        # A pod the apiserver would refuse is the user's spec: say so before applying.
        return Plan(
            [*writes, CheckPod(observed.desired_statefulset)],
            version=version,
            then=lambda refusal: _apply_statefulset(observed, version, refusal),
        )
    if sts is None:  # not reached: the applier applies a StatefulSet it has not seen
        return Plan(writes, Finding("RollingUpdate", "Waiting for the statefulset"), version=version)
    return _prepend(writes, _rollout(observed, sts, observed.since_apply, version))


def _holds(observed: Observed) -> bool:
    """An Update runs in the pod and this operator follows it there (pko's agent API): a Go operator's
    pod, met in a switch, is not held, as its Update ends ``OperationLost`` and its run is unobserved."""
    return bool(observed.running_updates) and serves_our_agent(observed.pod)


def _hold_roll(running: tuple[str, ...], version: str | None) -> Plan:
    """A new pod would end the operation running in this one (an upgrade of pko changes the agent's
    image under a live Stack), so the StatefulSet waits for it: the Update's end wakes this Workspace.
    Not Ready meanwhile, so that no other Update starts in a pod about to go. Every operation ends (the
    Update controller ends one whose agent stops answering), so the hold ends too."""
    names = ", ".join(running)
    message = f"Waiting for the running Update {names} to finish before replacing the workspace pod"
    return Plan([], Finding(REASON_UPDATE_RUNNING, message), version=version)


def _migrate(sts: Obj, fields: tuple[str, ...], version: str | None) -> Plan:
    """The Go operator's migration: delete, say so, and come back in 5 s to recreate."""
    what = ", ".join(fields)
    writes: list[Write] = [
        DeleteStatefulSet(sts, fields),
        Emit("Warning", "Migrated", "Replaced the workspace statefulset"),
    ]
    finding = Finding("RollingUpdate", f"Replacing the statefulset to change {what}")
    return Plan(writes, finding, Result.requeue_after(REQUEUE_MIGRATION), version=version)


def _apply_statefulset(observed: Observed, version: str | None, refusal: tuple[int, str] | None) -> Plan:
    if refusal is not None and refusal[0] == 422:
        return Plan([], Finding("SpecInvalid", short(refusal[1]), stalled=True), version=version)
    return Plan(
        [ApplyStatefulSet(observed.desired_statefulset, observed.statefulset)],
        version=version,
        then=lambda applied: _rollout(observed, applied, 0.0, version),
    )


def _rollout(observed: Observed, sts: Obj, since_apply: float | None, version: str | None) -> Plan:
    """The rollout as the StatefulSet controller reports it, then the pod, then its agent."""
    sts_status = sts.get("status") or {}
    waiting = Result.requeue_after(REQUEUE_WAITING)
    rolling = Finding("RollingUpdate", "Waiting for the statefulset to be updated")
    pod = observed.pod
    check = False
    if pod is None:
        # A refused pod shows only in the StatefulSet's Events (and its status stays
        # unobserved): ask the apiserver why, by a dry run, once the StatefulSet controller has
        # had time to create it (a pod it creates wakes us before then).
        grace = POD_CREATION_GRACE - since_apply if since_apply is not None else 0.0
        if grace > 0:
            waiting = Result.requeue_after(grace)
        else:
            check = True
    plan = _pod_plan(observed, sts, sts_status, pod, rolling, waiting, version)
    if not check:
        return plan

    def answered(refusal: tuple[int, str] | None) -> Plan:
        if refusal is None:
            return plan
        return Plan([], Finding("PodCreationFailed", short(refusal[1])), waiting, version=version)

    known = _recent_check(observed)
    if known is not None:
        return answered(known.refusal)
    return Plan([CheckPod(observed.desired_statefulset)], version=version, then=answered)


def digest_of(body: Obj) -> str:
    """The applied digest ``body`` is stamped with ("" when it is not)."""
    return str(((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_APPLIED_DIGEST) or "")


def _recent_check(observed: Observed) -> PodCheck | None:
    """The dry run that already answered for the desired StatefulSet's pod, if recent: the one
    before its apply, or one after the grace (then at most one per :data:`POD_CHECK_REUSE`).

    A missing pod after :data:`POD_CREATION_GRACE` is mostly a StatefulSet controller that has not
    got to it yet (many Workspaces applied at once: the 100-Stack deploy benchmark made 2.65 dry
    runs per Workspace, each a create in the audit log): the same template asked again within
    seconds gets the same answer. A refusal that comes later (a ServiceAccount deleted meanwhile)
    shows at the next look past the reuse, the backstop requeue's period; a changed template is
    another digest, asked at once.
    """
    check, digest = observed.pod_check, digest_of(observed.desired_statefulset)
    if check is None or not digest or check.digest != digest or check.age >= POD_CHECK_REUSE:
        return None
    return check


def _pod_plan(
    observed: Observed,
    sts: Obj,
    sts_status: Obj,
    pod: Obj | None,
    rolling: Finding,
    waiting: Result,
    version: str | None,
) -> Plan:
    if int(sts_status.get("observedGeneration") or 0) < int(sts["metadata"].get("generation") or 0):
        return Plan([], rolling, waiting, version=version)
    if pod is None:
        finding = Finding("WaitingForReplicas", "Waiting for the workspace pod to be available")
        return Plan([], finding, waiting, version=version)
    update_revision = sts_status.get("updateRevision")
    pod_revision = (pod["metadata"].get("labels") or {}).get(REVISION_LABEL)
    diagnosis = diagnose_pod(pod)
    if update_revision and pod_revision != update_revision:
        # The StatefulSet controller replaces it, ready or not: with podManagementPolicy
        # Parallel it does not wait for an old pod that never became ready (Go issue 801).
        # Unless its node is lost: the old pod is never confirmed deleted.
        plan = Plan([], rolling, waiting, version=version)
        return _check_node(pod, plan, version, observed.now) if diagnosis is not None else plan
    if diagnosis is not None:
        finding = Finding(diagnosis.reason, short(diagnosis.message), stalled=diagnosis.stalled)
        plan = Plan([], finding, Result.done() if diagnosis.stalled else waiting, version=version)
        waits = diagnosis.reason == "WaitingForReplicas"
        return _check_node(pod, plan, version, observed.now) if waits else plan
    # The pod is Ready: reach its agent.
    address = observed.address
    if address is None:
        finding = Finding("WaitingForReplicas", "Waiting for the workspace pod's IP")
        return Plan([], finding, waiting, version=version)
    annotations = pod["metadata"].get("annotations") or {}
    initialized = annotations.get(ANNOTATION_INITIALIZED) == "true"
    if initialized and version and annotations.get(ANNOTATION_STACKS_HASH) == observed.stacks_hash:
        return Plan([], Finding("Succeeded", "", ready=True), address=address, version=version)
    return Plan(
        [AskVersion(address)],
        version=version,
        then=lambda answer: _initialize(observed, pod, address, str(answer), install=not initialized),
    )


def _check_node(pod: Obj, plan: Plan, version: str | None, now: datetime | None) -> Plan:
    """Ask the pod's node whether it is why the pod waits (a pod bound to a node, not ready or
    terminating); ``plan`` stands when it is not, or cannot be read, or the pod is still starting
    (workloads.node_check_after: looked at again when that grace ends)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return plan
    starting = node_check_after(pod, now)
    if starting > 0:
        plan.result = sooner(plan.result, starting)
        return plan
    return Plan(
        [CheckNode(str(node))],
        version=version,
        then=lambda reading: _node_plan(pod, reading, plan, version),
    )


def _node_plan(pod: Obj, reading: NodeReading | None, plan: Plan, version: str | None) -> Plan:
    diagnosis: PodDiagnosis | None = diagnose_node(pod, reading) if reading is not None else None
    if diagnosis is None:
        return plan
    finding = Finding(diagnosis.reason, short(diagnosis.message), stalled=diagnosis.stalled)
    # No Node watch: the pod's events (its node back, or the pod deleted) normally wake us; this
    # is the backstop, or the end of the grace before Stalled.
    delay = min(REQUEUE_WAITING, diagnosis.recheck_after or REQUEUE_WAITING)
    return Plan([], finding, Result.requeue_after(delay), version=version)


def _initialize(observed: Observed, pod: Obj, address: str, version: str, *, install: bool) -> Plan:
    """The Go operator's initialization: Install, then each of ``spec.stacks``; then the pod is
    annotated with the ``stacks`` it has, so a new pod initializes again. A pod initialized before
    whose ``stacks`` changed (a config change: the pod did not roll) only has them applied again."""
    spec = observed.spec
    assert spec is not None  # decide() stops at an invalid spec
    refusal = incompatible(spec, version)
    if refusal is not None:
        message = f"Pulumi CLI version {version} is too old for JSON configuration support"
        return Plan([Emit("Warning", "StackInitializationFailure", message)], refusal, version=version)
    name = pod["metadata"]["name"]
    writes: list[Write] = []
    if install:
        writes += [
            WriteStatus(Finding("Installing", "Installing packages and plugins required by the program")),
            Install(),
        ]
    writes += [
        WriteStatus(Finding("Initializing", "Initializing and selecting a Pulumi stack")),
        *(InitStack(stack) for stack in spec.stacks or []),
        AnnotateInitialized(pod, version, observed.stacks_hash),
        Emit("Normal", "Initialized", f"Initialized workspace pod {name!r}")
        if install
        else Emit("Normal", "Reinitialized", f"Applied the changed stack settings to workspace pod {name!r}"),
    ]
    return Plan(writes, Finding("Succeeded", "", ready=True), address=address, version=version)


def refused(plan: Plan, write: Write, failure: Failure) -> Plan | None:
    """The rest of the reconcile after ``write`` failed; None when the failure is not one this
    controller reports (it propagates; the controller retries with backoff)."""
    version = plan.version
    if isinstance(write, ApplyService):
        if failure.kind == "api" and failure.status == 422:
            return Plan([], Finding("SpecInvalid", short(failure.message), stalled=True), version=version)
        return None
    if isinstance(write, ApplyStatefulSet):
        if failure.kind != "api" or failure.status != 422:
            return None
        if write.existing is not None and _IMMUTABLE_MESSAGE in failure.message:
            return _migrate(write.existing, ("spec",), version)
        return Plan([], Finding("SpecInvalid", short(failure.message), stalled=True), version=version)
    if isinstance(write, AnnotateInitialized):
        if failure.kind == "api" and failure.status in (404, 409, 422):
            # The pod went (or was replaced) meanwhile: its successor initializes from scratch.
            finding = Finding("WaitingForReplicas", "The workspace pod was replaced")
            return Plan([], finding, Result.requeue(), version=version)
        return None
    if isinstance(write, AskVersion):
        if failure.kind in ("agent", "token", "timeout", "network"):
            return _unreachable(failure, version)
        return None
    if isinstance(write, Install):
        if failure.kind in ("agent", "timeout"):
            message = short(failure.message)
            return Plan(
                [Emit("Warning", "InstallationFailure", message)],
                Finding("InstallationFailed", message, stalled=True),
                version=version,
            )
        return _unreachable(failure, version) if failure.kind in ("token", "network") else None
    if isinstance(write, InitStack):
        if failure.kind == "agent" and failure.code == "NOT_FOUND" and write.stack.create is not True:
            # A stack the Workspace may not create is absent from the backend: nothing to
            # configure. The pod still serves (an Update for that stack ends StackNotFound,
            # saying where it looked), and the other stacks are initialized.
            rest = plan.writes[plan.writes.index(write) + 1 :]
            event = (
                f"Stack {write.stack.name!r} is not in the backend and is not created here: {failure.message}"
            )
            return Plan(
                [Emit("Warning", "StackNotFound", short(event)), *rest],
                plan.finding,
                plan.result,
                address=plan.address,
                version=version,
            )
        if failure.kind == "agent" and failure.code == "FAILED_PRECONDITION":
            # The live agent runs an operation: its stack settings are not rewritten under it.
            message = short(f"Waiting to apply the stack settings: {failure.message}")
            return Plan(
                [], Finding("Initializing", message), Result.requeue_after(REQUEUE_BUSY), version=version
            )
        if failure.kind in ("agent", "timeout", "value"):
            message = short(failure.message)
            event = f"Failed to initialize stack {write.stack.name!r}: {message}"
            return Plan(
                [Emit("Warning", "StackInitializationFailure", event)],
                Finding("InitializationFailed", message, stalled=True),
                version=version,
            )
        return _unreachable(failure, version) if failure.kind in ("token", "network") else None
    return None


def _unreachable(failure: Failure, version: str | None) -> Plan:
    """The agent could not be used: ``ConnectionFailed`` (retry in 5 s) when it could not be
    reached, else the gRPC code's name as the Go operator reports it (e.g. ``Unauthenticated``:
    the agent's TokenReview failed, no system:auth-delegator binding; the pod is kept for
    diagnosis), asked again later."""
    message = short(failure.message)
    writes: list[Write] = [Emit("Warning", "ConnectionFailure", message)]
    if (failure.kind == "agent" and failure.code != "UNAVAILABLE") or failure.kind == "token":
        delay = REQUEUE_CONNECTION if failure.transient else REQUEUE_REFUSED
        return Plan(writes, Finding(failure.reason, message), Result.requeue_after(delay), version=version)
    finding = Finding("ConnectionFailed", message)
    return Plan(writes, finding, Result.requeue_after(REQUEUE_CONNECTION), version=version)
