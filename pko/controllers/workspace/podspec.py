"""The workspace pod's spec: its containers (``bootstrap``, ``fetch``, ``pulumi``), the restricted
security profile, the ``spec.podTemplate`` merge and the default ephemeral storage (pure functions).

:mod:`pko.controllers.workspace.workloads` wraps it in the StatefulSet and says why it differs from
the Go operator's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from pko.api.workspace import WorkspaceSpec
from pko.controllers.options import ControllerOptions
from pko.controllers.strategicmerge import strategic_merge
from pko.controllers.workspace.policysources import flux_env, git_env, policy_fetches
from pko.machinery.quantity import parse_quantity

Obj = dict[str, Any]

WORKSPACE_PORT: Final = 50051
# The agent's own /metrics (pko.agent.metricsserver), served as the operator serves its own unless
# --workspace-metrics says otherwise: HTTPS with a self-signed certificate made at start, each scraper's
# token reviewed (TokenReview, then a SubjectAccessReview for get on /metrics) with the identity that
# already reviews RPC callers (system:auth-delegator), so it needs no right of its own. The port's name
# says the scheme; a PodMonitor selects it by name (the chart's scrapes https-metrics).
METRICS_PORT: Final = 8443
METRICS_PORT_NAMES: Final = {"https": "https-metrics", "http": "http-metrics"}
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
# The build caches a program's toolchain keeps between runs (Go's build and module caches), on a volume
# of their own so a claim can keep them across pods: the ``cache`` volume is an emptyDir (the caches
# last as long as the pod, as $HOME did) unless ``spec.podTemplate`` gives it another source, such as
# a persistentVolumeClaim, which then replaces the emptyDir (:func:`finish_pod_spec`). A Go program's
# first pod compiles the Pulumi Go SDK (86 s of a 96 s first deploy on 2 cores); with the caches on a
# claim, later pods reuse it. Bounds: Go trims build-cache entries unused for 5 days itself, and the
# agent clears the caches at start when they hold more than ``GO_CACHE_MAX_BYTES`` (agent/gocache.py).
CACHE_VOLUME: Final = "cache"
CACHE_PATH: Final = "/cache"
GO_CACHE_ENV: Final = (("GOCACHE", f"{CACHE_PATH}/go-build"), ("GOMODCACHE", f"{CACHE_PATH}/go-mod"))

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


def pod_spec(name: str, namespace: str, spec: WorkspaceSpec, options: ControllerOptions) -> Obj:
    """The pod spec the operator builds for Workspace ``namespace/name``, before ``spec.podTemplate``."""
    init_containers = [_agent_container(BOOTSTRAP_CONTAINER, options, list(BOOTSTRAP_COPY), [])]
    fetch = _fetch_container(spec, options)
    if fetch is not None:
        init_containers.append(fetch)
    init_containers += [
        _agent_container(n, options, args, env)
        for n, args, env in policy_fetches(spec, options.flux_max_untar_size_bytes)
    ]
    built: Obj = {
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
        "volumes": [{"name": SHARE_VOLUME, "emptyDir": {}}, {"name": CACHE_VOLUME, "emptyDir": {}}],
    }
    if spec.security_profile == "restricted":
        _restrict(built)
    return built


def finish_pod_spec(merged: Obj) -> None:
    """What the operator adds after the template merge, so no template removes it: the ``pulumi``
    container's default ephemeral storage, ``PULUMI_ENV`` in every container; and the ``cache``
    volume's source is the template's when it gives one (a claim), not the operator's emptyDir too."""
    _one_cache_source(merged.get("volumes") or [])
    for container in merged.get("containers", []):
        if container.get("name") == PULUMI_CONTAINER:
            _default_ephemeral_storage(container)
    for container in [*merged.get("initContainers", []), *merged.get("containers", [])]:
        _set_env(container.setdefault("env", []), {"name": "PULUMI_ENV", "value": ENV_FILE})


def _set_env(env: list[Obj], var: Obj) -> None:
    """Set ``var`` in ``env``, replacing a same-named entry (apply refuses duplicate names)."""
    for i, existing in enumerate(env):
        if existing.get("name") == var["name"]:
            env[i] = var
            return
    env.append(var)


def _share_mount() -> Obj:
    return {"name": SHARE_VOLUME, "mountPath": SHARE_PATH}


def _one_cache_source(volumes: list[Obj]) -> None:
    """A ``cache`` volume the template gave a source of its own keeps only that source (a volume with
    two is refused), as Kubernetes' ``retainKeys`` strategy for volumes would."""
    for volume in volumes:
        if volume.get("name") == CACHE_VOLUME and len(set(volume) - {"name"}) > 1:
            volume.pop("emptyDir", None)


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


def _fetch_container(spec: WorkspaceSpec, options: ControllerOptions) -> Obj | None:
    """The ``fetch`` init container for the spec's source (None without one); secrets by reference only."""
    init = ["/share/agent", "init", "-t", SOURCE_DIR, "--workspace-dir", WORKSPACE_DIR]
    if spec.git is not None:
        return _agent_container(FETCH_CONTAINER, options, init, git_env(spec.git))
    if spec.flux is not None:
        return _agent_container(
            FETCH_CONTAINER, options, init, flux_env(spec.flux, options.flux_max_untar_size_bytes)
        )
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


def metrics_port(options: ControllerOptions) -> Obj | None:
    """The ``pulumi`` container's metrics port, None when the agents serve no /metrics."""
    port_name = METRICS_PORT_NAMES.get(options.workspace_metrics)
    if port_name is None:
        return None
    return {"name": port_name, "containerPort": METRICS_PORT, "protocol": "TCP"}


def _metrics_args(options: ControllerOptions) -> list[str]:
    if options.workspace_metrics == "off":
        return []
    args = ["--metrics-bind-address", f":{METRICS_PORT}"]
    return args if options.workspace_metrics == "https" else [*args, "--metrics-secure", "false"]


def _serve_command(name: str, namespace: str, spec: WorkspaceSpec, options: ControllerOptions) -> list[str]:
    command = [
        "/share/tini", "/share/agent", "--", "serve",
        "--workspace", WORKSPACE_DIR,
        "--skip-install",
        "--env-file", ENV_FILE,
        "--auth-mode", "kube",
        "--kube-audience", f"{name}.{namespace}",
        "--kube-workspace-namespace", namespace,
        "--kube-workspace-name", name,
        *_metrics_args(options),
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
    named = {str(v.get("name")) for v in env}
    env += [{"name": k, "value": v} for k, v in GO_CACHE_ENV if k not in named]  # the user's own win
    container: Obj = {
        "name": PULUMI_CONTAINER,
        "image": spec.image or options.workspace_image(spec.security_profile),
        "command": _serve_command(name, namespace, spec, options),
        "workingDir": WORKSPACE_DIR,
        "ports": [{"name": "grpc", "containerPort": WORKSPACE_PORT, "protocol": "TCP"}],
        "env": env,
        # The Go operator's defaulter: small requests, no limits.
        "resources": copy.deepcopy(dict(spec.with_defaults().resources or {})),
        "volumeMounts": [_share_mount(), {"name": CACHE_VOLUME, "mountPath": CACHE_PATH}],
    }
    metrics = metrics_port(options)
    if metrics is not None:
        container["ports"].append(metrics)
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
