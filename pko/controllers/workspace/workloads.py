"""What a Workspace runs as: its StatefulSet, headless Service and pod (pure functions, no I/O).

Follows the Go operator's ``newStatefulSet``/``newService`` (``auto/workspace_controller.go``) for
names, labels, containers, commands, env, volumes, security contexts and the order of the steps:
build the pod, apply the security profile, merge ``spec.podTemplate`` (a strategic merge: lists of
named things merge by name, base entries first), then add ``PULUMI_ENV`` to every container.
Differences, each for a reason:

* Every list a server-side apply treats as a map has unique keys and carries its whole key (a port's
  ``protocol``): apply refuses duplicates, and 1.20 needs ``protocol`` on a port to merge it. So the
  operator's env vars replace a same-named entry instead of appending a duplicate (the kubelet would
  have used the last one anyway: same result).
* The ``bootstrap`` container copies ``/agent-lib/`` beside ``/agent`` (``cp -r``): our agent is a
  one-folder bundle, where the Go agent is one static binary.
* The ``fetch`` container runs ``/share/agent init`` directly, not through ``sh -c``: the agent image
  has no shell. A ``local`` source is a ``busybox ln -sfn`` (the image's busybox).
* The operator-built init containers use ``terminationMessagePolicy: FallbackToLogsOnError``, so a
  failed fetch's last log lines are in the pod status, where :func:`diagnose_pod` reads them.
* ``auto.pulumi.com/revision-hash`` hashes the Workspace spec but ``stacks``, not the generation:
  the pod rolls exactly when what it runs changes (also for a change the pod template does not
  show), and not on a generation bump that changed nothing (deletion). ``stacks`` (their config,
  environments, secrets provider) reach the running agent instead, which the reconciler
  re-initializes: the Go operator re-creates the pod for a config change, which costs an update ten
  seconds on a small node. The pod's ``auto.pulumi.com/stacks-hash`` says which ``stacks`` its agent
  was initialized with (:func:`stacks_hash`).
* System labels and the revision hash are re-asserted after the template merge: a template that
  renamed them would break the (immutable) selector or the rollout.
* The StatefulSet and Service carry ``auto.pulumi.com/applied-digest``, a hash of what was applied,
  so the reconciler can tell from its cache that nothing needs writing.
* The ``pulumi`` container requests and is limited in ephemeral storage by default (the Go
  operator sets neither, and its workspace pods, holding 1.3 to 2.4 GiB of disk with no request, were
  evicted for disk pressure many times a day): see ``podspec._default_ephemeral_storage``. Added after the
  template merge, so it fills in only what neither ``spec.resources`` nor ``spec.podTemplate`` says.
* A ``cache`` volume (an emptyDir, mounted at ``/cache`` in the ``pulumi`` container) holds Go's build
  and module caches (``GOCACHE``, ``GOMODCACHE``), where the Go operator leaves them in the container's
  home: a claim the pod template gives the ``cache`` volume replaces the emptyDir, so a new pod of a Go
  program reuses the compiled Pulumi SDK (see ``podspec.CACHE_VOLUME``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from pko.api.validation import format_errors, workspace_spec_errors
from pko.api.workspace import WorkspaceSpec
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import WORKSPACE_COMPONENT, WORKSPACE_COMPONENT_LABEL, WORKSPACE_NAME_LABEL
from pko.controllers.sharding import shard_labels
from pko.controllers.workspace.podspec import (
    BOOTSTRAP_COPY,
    PULUMI_CONTAINER,
    WORKSPACE_DIR,
    WORKSPACE_PORT,
    finish_pod_spec,
    merge_pod_template,
    pod_spec,
)
from pko.machinery.conditions import parse_time
from pko.machinery.objects import set_controller_reference
from pko.machinery.writes import ANNOTATION_APPLIED_DIGEST, stamp
from pko.machinery.writes import digest as applied_digest

__all__ = [
    "AGENT_API",
    "ANNOTATION_AGENT_API",
    "ANNOTATION_APPLIED_DIGEST",
    "ANNOTATION_INITIALIZED",
    "ANNOTATION_REVISION_HASH",
    "ANNOTATION_STACKS_HASH",
    "BOOTSTRAP_COPY",
    "INIT_FAILURE_STALL_RESTARTS",
    "NODE_CHECK_GRACE",
    "NODE_LOST_GRACE",
    "OUT_OF_SERVICE_TAINT",
    "PULUMI_CONTAINER",
    "REVISION_LABEL",
    "WORKSPACE_DIR",
    "WORKSPACE_PORT",
    "NodeReading",
    "PodDiagnosis",
    "SpecInvalid",
    "applied_digest",
    "desired_service",
    "desired_statefulset",
    "diagnose_node",
    "diagnose_pod",
    "immutable_fields_changed",
    "merge_pod_template",
    "node_check_after",
    "parse_spec",
    "pod_name",
    "revision_hash",
    "serves_our_agent",
    "stacks_hash",
    "statefulset_name",
    "workspace_labels",
]

Obj = dict[str, Any]


ANNOTATION_REVISION_HASH: Final = "auto.pulumi.com/revision-hash"
ANNOTATION_INITIALIZED: Final = "auto.pulumi.com/initialized"
ANNOTATION_STACKS_HASH: Final = "auto.pulumi.com/stacks-hash"
# On pko's pod template: the gRPC API the pod's agent serves. An operator follows an operation only in a
# pod whose agent serves an API it speaks, so only such a pod is kept for a running Update (plan.py
# ``_hold_roll``); the Go operator's pods, met in a switch, lack it and roll at once.
ANNOTATION_AGENT_API: Final = "pko.pulumi.com/agent-api"
AGENT_API: Final = "pko.agent.v1"
# Set by the StatefulSet controller on each pod: the revision of the template it was made from.
REVISION_LABEL: Final = "controller-revision-hash"

# An init container that failed this many restarts in a row makes the Workspace Stalled.
INIT_FAILURE_STALL_RESTARTS: Final = 3
# A node not ready for this long (from its Ready condition's lastTransitionTime) makes the
# Workspace Stalled: a kubelet restart or a short network partition heals by itself within it;
# after it, only a person can decide the node is gone (Kubernetes never moves a StatefulSet pod
# off a node that may still run it).
NODE_LOST_GRACE: Final = 60.0
# A pod younger than this whose kubelet says why it is not ready yet is starting: its Node is not
# read before (node_check_after). Past it, a pod still waiting has its Node read on each reconcile.
NODE_CHECK_GRACE: Final = 30.0
# The taint a person puts on a node that is gone (non-graceful node shutdown): the pod GC then
# force-deletes its pods and the StatefulSet controller starts the workspace pod elsewhere.
OUT_OF_SERVICE_TAINT: Final = "node.kubernetes.io/out-of-service"
# How much of a failed container's termination message goes into a condition.
_LOG_TAIL_LINES: Final = 20
_LOG_TAIL_CHARS: Final = 2048

_IMAGE_PULL_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
# Waiting reasons that need the user (a missing Secret or ConfigMap, a bad command...).
_CONTAINER_ERROR_REASONS: Final = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "PreCreateHookError"}
)


class SpecInvalid(ValueError):
    """The Workspace spec cannot be turned into a pod (the user must change it)."""


def statefulset_name(workspace: str) -> str:
    """The StatefulSet and the Service share this name."""
    return f"{workspace}-workspace"


def pod_name(workspace: str) -> str:
    return f"{statefulset_name(workspace)}-0"


def workspace_labels(workspace: str) -> dict[str, str]:
    """Labels of the StatefulSet, Service and pod, and the StatefulSet's selector."""
    return {WORKSPACE_COMPONENT_LABEL: WORKSPACE_COMPONENT, WORKSPACE_NAME_LABEL: workspace}


def _hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def revision_hash(spec: Mapping[str, Any]) -> str:
    """A stable hash of a Workspace spec but its ``stacks`` (key order does not matter): changes
    exactly when what the pod runs does."""
    return _hash({key: value for key, value in spec.items() if key != "stacks"})


def stacks_hash(spec: Mapping[str, Any]) -> str:
    """A stable hash of a Workspace spec's ``stacks``: what its agent is initialized with."""
    return _hash(spec.get("stacks") or [])


def _finish(workspace: Mapping[str, Any], body: Obj) -> Obj:
    """Controlled by the Workspace (deleting it cascades), then stamped with its digest."""
    set_controller_reference(dict(workspace), body)
    return stamp(body)


def parse_spec(workspace: Mapping[str, Any]) -> WorkspaceSpec:
    """The Workspace's spec as a model, checked as the Stack's is (``pko.api.validation``): raises
    :class:`SpecInvalid` with the first problems, so a hand-made Workspace with, say, a git URL no git
    clones from stalls at once instead of failing in its init container."""
    try:
        spec = WorkspaceSpec.model_validate(workspace.get("spec") or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise SpecInvalid(problems) from exc
    errors = workspace_spec_errors(spec)
    if errors:
        raise SpecInvalid(format_errors(errors[:5]))
    return spec


def _meta(workspace: Mapping[str, Any]) -> tuple[str, str]:
    meta = workspace.get("metadata") or {}
    return str(meta["name"]), str(meta.get("namespace") or "")


def _pod_annotations(revision: str) -> dict[str, str]:
    """The annotations pko asserts on its pod template, over any a ``podTemplate`` sets."""
    return {ANNOTATION_REVISION_HASH: revision, ANNOTATION_AGENT_API: AGENT_API}


def serves_our_agent(pod: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` runs an agent whose operations this operator can follow (not the Go operator's)."""
    annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_AGENT_API) == AGENT_API


def desired_statefulset(workspace: Mapping[str, Any], spec: WorkspaceSpec, options: ControllerOptions) -> Obj:
    """The StatefulSet to apply for ``workspace`` (read from the API: the owner reference needs its uid)."""
    name, namespace = _meta(workspace)
    labels = workspace_labels(name)
    revision = revision_hash(workspace.get("spec") or {})
    template: Obj = {
        "metadata": {"labels": dict(labels), "annotations": _pod_annotations(revision)},
        "spec": pod_spec(name, namespace, spec, options),
    }
    if spec.pod_template is not None:
        template = merge_pod_template(
            template, spec.pod_template.model_dump(by_alias=True, exclude_none=True)
        )
        meta = template.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(labels)
        meta.setdefault("annotations", {}).update(_pod_annotations(revision))
    finish_pod_spec(template["spec"])
    return _finish(
        workspace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            # The shard label on the StatefulSet only, not its pod: a move must not restart the pod.
            "metadata": {
                "name": statefulset_name(name),
                "namespace": namespace,
                "labels": {**labels, **shard_labels(workspace)},
            },
            "spec": {
                "selector": {"matchLabels": dict(labels)},
                "serviceName": statefulset_name(name),
                "replicas": 1,
                "podManagementPolicy": "Parallel",
                "template": template,
            },
        },
    )


def desired_service(workspace: Mapping[str, Any], spec: WorkspaceSpec) -> Obj:
    """The headless Service: ``serviceTemplate`` labels (system labels win) and annotations."""
    name, namespace = _meta(workspace)
    labels = workspace_labels(name)
    metadata: Obj = {
        "name": statefulset_name(name),
        "namespace": namespace,
        "labels": {**labels, **shard_labels(workspace)},
    }
    template_meta = spec.service_template.metadata if spec.service_template is not None else None
    if template_meta is not None:
        meta = template_meta.model_dump(by_alias=True, exclude_none=True)
        metadata["labels"] = {**(meta.get("labels") or {}), **labels, **shard_labels(workspace)}
        if meta.get("annotations"):
            metadata["annotations"] = dict(meta["annotations"])
    return _finish(
        workspace,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {
                "clusterIP": "None",
                "selector": dict(labels),
                "ports": [{"name": "grpc", "port": WORKSPACE_PORT, "protocol": "TCP"}],
            },
        },
    )


def immutable_fields_changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[str]:
    """The StatefulSet spec fields that differ but cannot be updated in place (delete and recreate)."""
    cur, want = current.get("spec") or {}, desired.get("spec") or {}
    changed = []
    if (cur.get("selector") or {}) != (want.get("selector") or {}):
        changed.append("selector")
    for field in ("serviceName", "podManagementPolicy"):
        if want.get(field) is not None and cur.get(field) != want.get(field):
            changed.append(field)
    if (cur.get("volumeClaimTemplates") or []) and not want.get("volumeClaimTemplates"):
        changed.append("volumeClaimTemplates")
    return changed


# --- reading the pod ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodDiagnosis:
    """Why the workspace pod is not ready, as a condition reason a user can act on."""

    reason: str
    message: str
    stalled: bool = False
    recheck_after: float | None = None  # the diagnosis changes by itself then (a grace ends)


def _tail(text: str) -> str:
    lines = text.strip().splitlines()[-_LOG_TAIL_LINES:]
    tail = "\n".join(lines)
    return tail if len(tail) <= _LOG_TAIL_CHARS else "..." + tail[-_LOG_TAIL_CHARS:]


def _failed_run(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's last failed run (exit code != 0), current or previous."""
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        terminated = state.get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            return dict(terminated)
    return None


def _describe_failure(kind: str, status: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    restarts = int(status.get("restartCount") or 0)
    detail = run.get("reason") or "Error"
    text = f'{kind} "{status.get("name")}" failed (exit code {run.get("exitCode")}, {detail}'
    text += f", {restarts} restart{'s' if restarts != 1 else ''})"
    logs = str(run.get("message") or "")
    return f"{text}: {_tail(logs)}" if logs.strip() else text


def _waiting_problem(kind: str, status: Mapping[str, Any]) -> PodDiagnosis | None:
    waiting = (status.get("state") or {}).get("waiting") or {}
    reason, message = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
    name = status.get("name")
    if reason in _IMAGE_PULL_REASONS:
        text = f'{kind} "{name}": cannot pull image "{status.get("image")}" ({reason})'
        return PodDiagnosis("ImagePullFailed", f"{text}: {message}" if message else text)
    if reason in _CONTAINER_ERROR_REASONS:
        text = f'{kind} "{name}": {reason}'
        return PodDiagnosis("ContainerConfigError", f"{text}: {message}" if message else text)
    return None


def diagnose_pod(pod: Mapping[str, Any]) -> PodDiagnosis | None:
    """Why ``pod`` is not serving yet (None: it is Ready), the most actionable problem first.

    An init container that failed :data:`INIT_FAILURE_STALL_RESTARTS` times in a row is reported
    Stalled: the kubelet keeps retrying it with backoff, but only a changed spec (or source) fixes it.
    """
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name = meta.get("name")
    if meta.get("deletionTimestamp"):
        return PodDiagnosis("WaitingForReplicas", f"The workspace pod {name} is terminating")
    if status.get("phase") == "Failed":
        why = status.get("message") or status.get("reason") or "the pod failed"
        return PodDiagnosis("PodFailed", f"The workspace pod {name} failed: {why}")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        return PodDiagnosis(
            str(scheduled.get("reason") or "Unschedulable"),
            f"The workspace pod {name} cannot be scheduled: {scheduled.get('message') or ''}".rstrip(": "),
        )
    for init in status.get("initContainerStatuses") or []:
        terminated = (init.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode", 0) == 0:
            continue
        problem = _waiting_problem("init container", init)
        if problem is not None:
            return problem
        run = _failed_run(init)
        if run is not None:
            stalled = int(init.get("restartCount") or 0) >= INIT_FAILURE_STALL_RESTARTS
            return PodDiagnosis(
                "InitContainerFailed", _describe_failure("init container", init, run), stalled
            )
        return PodDiagnosis(
            "WaitingForReplicas", f'Waiting for init container "{init.get("name")}" to complete'
        )
    for container in status.get("containerStatuses") or []:
        problem = _waiting_problem("container", container)
        if problem is not None:
            return problem
        state = container.get("state") or {}
        run = _failed_run(container)
        if run is not None and (
            "terminated" in state or (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff"
        ):
            return PodDiagnosis("CrashLoopBackOff", _describe_failure("container", container, run))
    ready = conditions.get("Ready")
    if ready is not None and ready.get("status") == "True":
        return None
    return PodDiagnosis("WaitingForReplicas", "Waiting for the workspace pod to be available")


# --- reading the pod's node ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeReading:
    """What one GET of the workspace pod's Node said, at ``now`` (wall clock: node times are):
    ``exists`` False when the Node is gone; else its Ready condition and its taint keys."""

    now: datetime
    exists: bool = True
    ready: Mapping[str, Any] | None = None
    taints: frozenset[str] = frozenset()

    @classmethod
    def of(cls, node: Mapping[str, Any] | None, now: datetime) -> NodeReading:
        """The reading of ``node`` as the API returned it (None: not found); keeps only what
        :func:`diagnose_node` needs, not the (large) Node."""
        if node is None:
            return cls(now, exists=False)
        status, spec = node.get("status") or {}, node.get("spec") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        taints = frozenset(str(t.get("key") or "") for t in spec.get("taints") or [])
        return cls(now, ready=dict(ready) if ready is not None else None, taints=taints)


def diagnose_node(pod: Mapping[str, Any], reading: NodeReading) -> PodDiagnosis | None:
    """Why a not-ready ``pod`` bound to a node waits on that node (None: the node is Ready, or says
    nothing: the pod's own diagnosis stands).

    A StatefulSet pod is never replaced while its node may still run it, so a node that went
    Unknown (``NodeLost``: its kubelet stopped posting) or NotReady (``NodeNotReady``) holds the
    workspace until the node returns or a person declares it gone; Stalled after
    :data:`NODE_LOST_GRACE`, with the command that does it. A deleted node, or one marked out of
    service, is being handled by the pod GC: not stalled.
    """
    meta = pod.get("metadata") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    where = f"The workspace pod {meta.get('namespace')}/{meta.get('name')} is on node {node}"
    if not reading.exists:
        return PodDiagnosis(
            "NodeLost", f"{where}, which no longer exists: waiting for Kubernetes to delete the pod"
        )
    ready = reading.ready
    if ready is None or ready.get("status") not in ("Unknown", "False"):
        return None
    reason = "NodeLost" if ready.get("status") == "Unknown" else "NodeNotReady"
    if OUT_OF_SERVICE_TAINT in reading.taints:
        message = f"{where}, which is marked out of service: waiting for Kubernetes to delete the pod"
        return PodDiagnosis(reason, message)
    since = parse_time(ready.get("lastTransitionTime"))
    detail = str(ready.get("message") or ready.get("reason") or "").strip()
    message = (
        f"{where}, which has not been ready since {ready.get('lastTransitionTime') or 'an unknown time'}"
        f"{f' ({detail})' if detail else ''}. Kubernetes will not start the pod elsewhere while the node "
        f"may still run it. If {node} is gone for good, mark it out of service: kubectl taint nodes {node} "
        f"{OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute (or delete the Node); the workspace then starts "
        "on another node, which removes a stack lock the lost pod held. A stack state kept on a volume of "
        "that node stays with the node."
    )
    left = NODE_LOST_GRACE - (reading.now - since).total_seconds() if since is not None else 0.0
    if left > 0:
        return PodDiagnosis(reason, message, recheck_after=left)
    return PodDiagnosis(reason, message, stalled=True)


def node_check_after(pod: Mapping[str, Any], now: datetime | None) -> float:
    """Seconds until the Node of a not-ready ``pod`` is worth a GET (0.0: now; ``now`` None: now).

    A pod starting normally has nothing to learn from its node, and it is reconciled several times
    as it starts (the 20-Stack deploy benchmark: 6.1 Node GETs per Workspace). So the Node waits
    while the pod is starting: younger than :data:`NODE_CHECK_GRACE`, not terminating, and its
    Ready condition absent or with the kubelet's reason (``ContainersNotReady``); the reconcile
    looks again when the grace ends. A lost node shows at once all the same: the node lifecycle
    controller marks its pods not ready without a reason (the kubelet's own Ready=True has none),
    and the pods a rollout or an eviction deletes are terminating. A pod whose node is lost while
    it starts is diagnosed when the grace ends.
    """
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    if now is None or created is None or meta.get("deletionTimestamp"):
        return 0.0
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is not None and not ready.get("reason"):
        return 0.0
    return max(0.0, NODE_CHECK_GRACE - (now - created).total_seconds())
