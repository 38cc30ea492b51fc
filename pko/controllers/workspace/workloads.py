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
  evicted for disk pressure many times a day): see :func:`_default_ephemeral_storage`. Added after the
  template merge, so it fills in only what neither ``spec.resources`` nor ``spec.podTemplate`` says.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from pydantic import ValidationError

from pko.api.validation import format_errors, workspace_spec_errors
from pko.api.workspace import WorkspaceSpec
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import WORKSPACE_COMPONENT, WORKSPACE_COMPONENT_LABEL, WORKSPACE_NAME_LABEL
from pko.controllers.strategicmerge import strategic_merge
from pko.machinery.objects import set_controller_reference
from pko.machinery.quantity import parse_quantity
from pko.machinery.writes import ANNOTATION_APPLIED_DIGEST, stamp
from pko.machinery.writes import digest as applied_digest

__all__ = [
    "ANNOTATION_APPLIED_DIGEST",
    "ANNOTATION_INITIALIZED",
    "ANNOTATION_REVISION_HASH",
    "ANNOTATION_STACKS_HASH",
    "INIT_FAILURE_STALL_RESTARTS",
    "NODE_LOST_GRACE",
    "OUT_OF_SERVICE_TAINT",
    "PULUMI_CONTAINER",
    "REVISION_LABEL",
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
    "parse_spec",
    "pod_name",
    "revision_hash",
    "stacks_hash",
    "statefulset_name",
    "workspace_labels",
]

Obj = dict[str, Any]

WORKSPACE_PORT: Final = 50051
PULUMI_CONTAINER: Final = "pulumi"
BOOTSTRAP_CONTAINER: Final = "bootstrap"
FETCH_CONTAINER: Final = "fetch"
# The agent image's executable, the folder it runs from (a PyInstaller one-folder build: no unpacking
# at each start) and tini, copied where the user's Pulumi image can run them.
BOOTSTRAP_COPY: Final = ("cp", "-r", "/agent", "/agent-lib", "/tini", "/share/")
SHARE_VOLUME: Final = "share"
SHARE_PATH: Final = "/share"
WORKSPACE_DIR: Final = "/share/workspace"
SOURCE_DIR: Final = "/share/source"
ENV_FILE: Final = "/share/.env"
TERMINATION_GRACE_PERIOD_SECONDS: Final = 600

ANNOTATION_REVISION_HASH: Final = "auto.pulumi.com/revision-hash"
ANNOTATION_INITIALIZED: Final = "auto.pulumi.com/initialized"
ANNOTATION_STACKS_HASH: Final = "auto.pulumi.com/stacks-hash"
# Set by the StatefulSet controller on each pod: the revision of the template it was made from.
REVISION_LABEL: Final = "controller-revision-hash"

# An init container that failed this many restarts in a row makes the Workspace Stalled.
INIT_FAILURE_STALL_RESTARTS: Final = 3
# A node not ready for this long (from its Ready condition's lastTransitionTime) makes the
# Workspace Stalled: a kubelet restart or a short network partition heals by itself within it;
# after it, only a person can decide the node is gone (Kubernetes never moves a StatefulSet pod
# off a node that may still run it).
NODE_LOST_GRACE: Final = 60.0
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
_RESTRICTED_CAPABILITIES: Final[Obj] = {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}

EPHEMERAL_STORAGE: Final = "ephemeral-storage"
# The ``pulumi`` container's ephemeral storage by default. What a workspace pod writes to the node's disk
# (the container's writable layer, its logs and the ``share`` emptyDir, all counted against the pod's limit)
# is, measured (2026-11-27, the images of hack/build-images.sh): the agent copied into /share, 121 MB; the
# program's source and dependencies: node_modules with the Node.js SDK and the kubernetes, random and
# command SDKs, 155 MB (what a program's own `npm install` of them writes); a Go program on the Pulumi SDK
# alone (e2e/test_languages.py's), 1.05 GB, as the language host builds it in the pod (Go's module cache
# 500 MB, its build cache 515 MB, the binary 39 MB), more with a provider's Go SDK; and any plugin the
# engine downloads at run time into $PULUMI_HOME (those in the image, such as the 159 MB kubernetes
# provider, are not written). Go operator users measured 1.3 to 2.4 GiB per workspace pod. So: request 1Gi,
# what a typical program holds, so the scheduler stops placing workspace pods on a node whose disk they
# would fill; limit 4Gi, above the largest figure measured with room to spare, so the kubelet evicts a
# runaway pod alone (not its neighbours, under node disk pressure). A program that needs more (a Go program
# on a large provider SDK) raises either in spec.resources or in the pulumi container's resources in
# spec.podTemplate (the Stack's workspaceTemplate sets both).
DEFAULT_EPHEMERAL_STORAGE_REQUEST: Final = "1Gi"
DEFAULT_EPHEMERAL_STORAGE_LIMIT: Final = "4Gi"


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


def _set_env(env: list[Obj], var: Obj) -> None:
    """Set ``var`` in ``env``, replacing a same-named entry (apply refuses duplicate names)."""
    for i, existing in enumerate(env):
        if existing.get("name") == var["name"]:
            env[i] = var
            return
    env.append(var)


def _share_mount() -> Obj:
    return {"name": SHARE_VOLUME, "mountPath": SHARE_PATH}


def _agent_container(name: str, options: ControllerOptions, args: list[str], env: list[Obj]) -> Obj:
    container: Obj = {
        "name": name,
        "image": options.agent_image,
        "imagePullPolicy": options.agent_image_pull_policy,
        "args": args,
        "volumeMounts": [_share_mount()],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if env:
        container["env"] = env
    return container


def _secret_env(name: str, selector: Mapping[str, Any] | None) -> list[Obj]:
    return [] if selector is None else [{"name": name, "valueFrom": {"secretKeyRef": dict(selector)}}]


def _fetch_container(spec: WorkspaceSpec, options: ControllerOptions) -> Obj | None:
    """The ``fetch`` init container for the spec's source (None without one); secrets by reference only."""
    init = ["/share/agent", "init", "-t", SOURCE_DIR, "--workspace-dir", WORKSPACE_DIR]
    if spec.git is not None:
        git = spec.git
        env: list[Obj] = [
            {"name": "GIT_URL", "value": git.url or ""},
            {"name": "GIT_REVISION", "value": git.ref or ""},
            {"name": "GIT_DIR", "value": git.dir or ""},
        ]
        if git.shallow:
            env.append({"name": "GIT_SHALLOW", "value": "true"})
        auth = git.auth
        if auth is not None:
            env += _secret_env("GIT_SSH_PRIVATE_KEY", auth.ssh_private_key)
            env += _secret_env("GIT_USERNAME", auth.username)
            env += _secret_env("GIT_PASSWORD", auth.password)
            env += _secret_env("GIT_TOKEN", auth.token)
            if auth.github_app is not None:
                env += _secret_env("GIT_GITHUB_APP_ID", auth.github_app.app_id)
                env += _secret_env("GIT_GITHUB_APP_INSTALLATION_ID", auth.github_app.installation_id)
                env += _secret_env("GIT_GITHUB_APP_PRIVATE_KEY", auth.github_app.private_key)
        return _agent_container(FETCH_CONTAINER, options, init, env)
    if spec.flux is not None:
        flux = spec.flux
        env = [
            {"name": "FLUX_URL", "value": flux.url or ""},
            {"name": "FLUX_DIGEST", "value": flux.digest or ""},
            {"name": "FLUX_DIR", "value": flux.dir or ""},
        ]
        if options.flux_max_untar_size_bytes is not None:
            env.append({"name": "FLUX_MAX_UNTAR_SIZE_BYTES", "value": str(options.flux_max_untar_size_bytes)})
        return _agent_container(FETCH_CONTAINER, options, init, env)
    if spec.local is not None:
        local_dir = spec.local.dir or ""
        args = ["/bin/busybox", "ln", "-sfn", local_dir, WORKSPACE_DIR]
        return _agent_container(FETCH_CONTAINER, options, args, [{"name": "LOCAL_DIR", "value": local_dir}])
    if spec.project_info is not None:
        info = spec.project_info
        env = [
            {"name": "PROJECT_NAME", "value": info.name},
            {"name": "PROJECT_RUNTIME", "value": info.runtime},
        ]
        return _agent_container(FETCH_CONTAINER, options, ["/share/agent", "init", "-t", WORKSPACE_DIR], env)
    return None


def _serve_command(name: str, namespace: str, spec: WorkspaceSpec) -> list[str]:
    command = [
        "/share/tini", "/share/agent", "--", "serve",
        "--workspace", WORKSPACE_DIR,
        "--skip-install",
        "--env-file", ENV_FILE,
        "--auth-mode", "kube",
        "--kube-audience", f"{name}.{namespace}",
        "--kube-workspace-namespace", namespace,
        "--kube-workspace-name", name,
    ]  # fmt: skip
    if spec.pulumi_log_level:
        command += ["--pulumi-log-level", str(spec.pulumi_log_level)]
    return command


def _pulumi_container(name: str, namespace: str, spec: WorkspaceSpec, options: ControllerOptions) -> Obj:
    env: list[Obj] = [copy.deepcopy(dict(v)) for v in spec.env or []]
    _set_env(env, {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    _set_env(
        env, {"name": "POD_SA_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}
    )
    # The agent's memory limit is the reserved amount (Go operator issue 698).
    memlimit = {"containerName": PULUMI_CONTAINER, "resource": "requests.memory"}
    _set_env(env, {"name": "AGENT_MEMLIMIT", "valueFrom": {"resourceFieldRef": memlimit}})
    container: Obj = {
        "name": PULUMI_CONTAINER,
        "image": spec.image or options.workspace_image(spec.security_profile),
        "command": _serve_command(name, namespace, spec),
        "workingDir": WORKSPACE_DIR,
        "ports": [{"name": "grpc", "containerPort": WORKSPACE_PORT, "protocol": "TCP"}],
        "env": env,
        # The Go operator's defaulter: small requests, no limits.
        "resources": copy.deepcopy(dict(spec.with_defaults().resources or {})),
        "volumeMounts": [_share_mount()],
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    if spec.env_from:
        container["envFrom"] = [copy.deepcopy(dict(v)) for v in spec.env_from]
    return container


def merge_pod_template(base: Mapping[str, Any], template: Mapping[str, Any] | None) -> Obj:
    """``template`` (a pod template: metadata + spec) merged over ``base`` as the Go operator does.

    Containers, init containers, volumes, env and ports merge by name (volume mounts by mount
    path): a template entry overrides the fields it sets and keeps the rest; a new entry is added
    after the operator's (so ``bootstrap`` and ``fetch`` still run first). Maps merge key by key;
    any other field the template sets (tolerations, terminationGracePeriodSeconds...) replaces.
    """
    if not template:
        return copy.deepcopy(dict(base))
    patch = {k: v for k, v in template.items() if k in ("metadata", "spec") and v is not None}
    return strategic_merge(base, patch)


def _restrict(pod_spec: Obj) -> None:
    """The restricted Pod Security profile: non-root 1000:1000, no privilege escalation, caps dropped."""
    pod_spec["securityContext"].update({"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000})
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        context = container.setdefault("securityContext", {})
        context["allowPrivilegeEscalation"] = False
        context["capabilities"] = copy.deepcopy(_RESTRICTED_CAPABILITIES)


def _quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity (``1Gi``, ``500M``, ``1e9``) as a number; None when it is not one
    (the API server then refuses the pod, naming it: nothing here second-guesses it)."""
    if not isinstance(value, str | int | float):
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _unset(value: Any) -> bool:
    """An absent or zero quantity: as for the cpu and memory requests (``WorkspaceSpec.with_defaults``),
    zero means "the default" (a zero limit would evict the pod at its first byte written)."""
    return value is None or _quantity(value) == 0


def _at_most(a: str, b: Any) -> bool:
    """``a`` <= ``b``, both quantities (False when either is not one)."""
    qa, qb = _quantity(a), _quantity(b)
    return qa is not None and qb is not None and qa <= qb


def _default_ephemeral_storage(container: Obj) -> None:
    """The default ephemeral-storage request and limit, where the container's resources name none.

    Kubernetes refuses a request above the limit, so a default never crosses what the user set: with
    only a limit set, the request is the smaller of the default and that limit; with only a request set,
    the limit is the larger of the default and that request. A figure that is no quantity is copied to
    the other side as it is, for the API server to refuse with its own message.
    """
    resources = container.setdefault("resources", {})
    requests: Obj = dict(resources.get("requests") or {})
    limits: Obj = dict(resources.get("limits") or {})
    if _unset(requests.get(EPHEMERAL_STORAGE)):
        limit = limits.get(EPHEMERAL_STORAGE)
        keep_under = not _unset(limit) and not _at_most(DEFAULT_EPHEMERAL_STORAGE_REQUEST, limit)
        requests[EPHEMERAL_STORAGE] = limit if keep_under else DEFAULT_EPHEMERAL_STORAGE_REQUEST
    if _unset(limits.get(EPHEMERAL_STORAGE)):
        request = requests[EPHEMERAL_STORAGE]
        keep_over = not _at_most(request, DEFAULT_EPHEMERAL_STORAGE_LIMIT)
        limits[EPHEMERAL_STORAGE] = request if keep_over else DEFAULT_EPHEMERAL_STORAGE_LIMIT
    resources["requests"] = requests
    resources["limits"] = limits


def desired_statefulset(workspace: Mapping[str, Any], spec: WorkspaceSpec, options: ControllerOptions) -> Obj:
    """The StatefulSet to apply for ``workspace`` (read from the API: the owner reference needs its uid)."""
    name, namespace = _meta(workspace)
    labels = workspace_labels(name)
    revision = revision_hash(workspace.get("spec") or {})
    init_containers = [_agent_container(BOOTSTRAP_CONTAINER, options, list(BOOTSTRAP_COPY), [])]
    fetch = _fetch_container(spec, options)
    if fetch is not None:
        init_containers.append(fetch)
    pod_spec: Obj = {
        "serviceAccountName": spec.service_account_name,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": TERMINATION_GRACE_PERIOD_SECONDS,
        "initContainers": init_containers,
        "containers": [_pulumi_container(name, namespace, spec, options)],
        # No sizeLimit on ``share``: the kubelet already counts this emptyDir against the pod's
        # ephemeral-storage limit (the sum of its containers' limits: the pulumi container's, by
        # default 4Gi), and a sizeLimit would be a second cap that a user who raised the container's
        # limit for a large Go or node_modules program would also have to find and raise (in the pod
        # template's volumes) before the pod stopped being evicted.
        "volumes": [{"name": SHARE_VOLUME, "emptyDir": {}}],
    }
    if spec.security_profile == "restricted":
        _restrict(pod_spec)
    template: Obj = {
        "metadata": {"labels": dict(labels), "annotations": {ANNOTATION_REVISION_HASH: revision}},
        "spec": pod_spec,
    }
    if spec.pod_template is not None:
        template = merge_pod_template(
            template, spec.pod_template.model_dump(by_alias=True, exclude_none=True)
        )
        meta = template.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(labels)
        meta.setdefault("annotations", {})[ANNOTATION_REVISION_HASH] = revision
    pod_spec = template["spec"]
    for container in pod_spec.get("containers", []):
        if container.get("name") == PULUMI_CONTAINER:
            _default_ephemeral_storage(container)
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        _set_env(container.setdefault("env", []), {"name": "PULUMI_ENV", "value": ENV_FILE})
    return _finish(
        workspace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": statefulset_name(name), "namespace": namespace, "labels": dict(labels)},
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
    metadata: Obj = {"name": statefulset_name(name), "namespace": namespace, "labels": dict(labels)}
    template_meta = spec.service_template.metadata if spec.service_template is not None else None
    if template_meta is not None:
        meta = template_meta.model_dump(by_alias=True, exclude_none=True)
        metadata["labels"] = {**(meta.get("labels") or {}), **labels}
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


def _parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


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
    since = _parse_time(ready.get("lastTransitionTime"))
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
