"""A play-kubelet: runs workspace pods as local processes and reports them as a kubelet would.

There is no kubelet (nor container runtime) in the test control plane, so this plays one, the way
upstream's envtest suite writes pod status by hand, but with the real programs running. Everything
upstream of the pod is the product's own code path: the operator applies a StatefulSet, the real
kube-controller-manager's StatefulSet controller creates the pod, and only then does this harness
act, on pods labelled ``auto.pulumi.com/component=workspace`` in the namespaces it is given:

* **Scheduling.** It binds the pod to its Node (``play-kubelet``, created if missing) through the
  ``pods/binding`` subresource, as the scheduler does; a bound pod is deleted gracefully by the
  apiserver, and the Node's existence keeps the pod GC from removing it. ``unschedulable(key)``
  instead writes ``PodScheduled=False`` (reason ``Unschedulable``) and leaves the pod pending.
* **Sandbox.** Each pod gets a loopback IP of its own (``127.a.b.c``, never reused in a process;
  the whole 127/8 is routed to ``lo`` on Linux) as ``status.podIP``; ``hostIP`` is 127.0.0.1.
  Every volume is a directory under the pod's directory (emptyDir; secret, configMap, projected and
  downwardAPI volumes are written from the API; a PVC is a directory per claim that outlives pods),
  and each container's mount paths are rewritten in its command, args, env and workingDir
  (``/share`` -> ``<pod dir>/volumes/share``).
* **Containers.** Init containers run in order, then the main containers, each as a process
  group; restartPolicy Always restarts exited containers after a (short) doubling back-off with
  ``CrashLoopBackOff`` and a growing ``restartCount``. A failed init container is restarted the same
  way and keeps ``Initialized=False``; with ``terminationMessagePolicy: FallbackToLogsOnError`` its
  ``message`` is the tail of its output (the kubelet's 80 lines / 2 KiB). An image the harness does
  not know is never run: ``ErrImagePull`` then ``ImagePullBackOff``, retried as a kubelet retries.
* **Programs.** An image has no filesystem here, so the agent image's programs are mapped: a
  command naming ``agent`` (``/share/agent ...``, ``/share/tini /share/agent -- ...``, ``/agent``)
  runs ``python -m pko.agent ...`` (``serve`` gets ``--host <podIP>``), the bootstrap copy
  ``cp -r /agent /agent-lib /tini /share/`` writes small shims instead and succeeds, ``tini`` is
  dropped; any other command runs as it is (``sh -c 'echo hi > /share/x'``). Every container gets
  the Pulumi engine first on PATH and its PULUMI_* variables as the image's environment (the
  container's own env wins); the file backend is shared by all pods of one harness, like a real
  backend. The engine is the stand-in CLI unless ``engine=make_real_pulumi`` (test/realpulumi.py)
  brings the real one.
* **Identity.** A container that mounts the service-account token path gets ``KUBECONFIG`` pointing
  at the test apiserver with a TokenRequest token bound to the pod, minted for the pod's
  ``serviceAccountName`` (what in-cluster config gives a real pod), so the agent's
  ``--auth-mode kube`` does real TokenReviews and SubjectAccessReviews.
* **Deletion.** A pod with a ``deletionTimestamp`` gets SIGTERM, then SIGKILL after its grace period
  (optionally capped by ``max_grace``), then is deleted with ``gracePeriodSeconds=0``, as a kubelet
  finishes a deletion, so the StatefulSet controller creates the replacement.

Not played: liveness and startup probes, lifecycle hooks, resource limits, service links, image pull
policy, pod-level securityContext. Readiness probes are (tcpSocket, grpc, httpGet, exec).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import secrets
import shlex
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from fakepulumi.fixtures import FakePulumi, make_fake_pulumi
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.machinery.quantity import parse_quantity
from pko.machinery.resource import CONFIGMAPS, PODS, SECRETS, ResourceClient

__all__ = [
    "AGENT_IMAGE",
    "AGENT_PORT",
    "IMAGE_CONFIG",
    "KNOWN_IMAGES",
    "NODE_NAME",
    "WORKSPACE_SELECTOR",
    "PlayKubelet",
    "create_service_account",
    "grant_auth_delegator",
    "grant_workspace_rpc",
    "mint_token",
    "normalize_image",
    "rewrite_paths",
]

Obj = dict[str, Any]
log = logging.getLogger("pko.test.kubelet")

WORKSPACE_SELECTOR = "auto.pulumi.com/component=workspace"
NODE_NAME = "play-kubelet"
AGENT_PORT = 50051
# The test world's images (what conftest's operator and kubelet fixtures use).
AGENT_IMAGE = "pko-agent:test"
# The images the play-kubelet can "pull" unless a module says otherwise: the agent image the operator
# is configured with, the Go operator's default workspace images, and two common utility images.
KNOWN_IMAGES: tuple[str, ...] = (
    AGENT_IMAGE,
    "pulumi/pulumi:latest-nonroot",
    "pulumi/pulumi:latest",
    "busybox",
    "alpine",
)
# The agent image's ENTRYPOINT (agent/Dockerfile): a container with only args runs through tini.
IMAGE_CONFIG: dict[str, tuple[list[str], list[str]]] = {
    AGENT_IMAGE: (["/tini", "--"], ["/agent", "serve", "--workspace", "/share/workspace"]),
}
SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# The kubelet's FallbackToLogsOnError tail: 80 lines, at most 2 KiB.
TAIL_LINES = 80
TAIL_BYTES = 2048
_SLEEP_FOREVER = [sys.executable, "-c", "import time; time.sleep(10**9)"]
_BOOTSTRAP = ["<bootstrap-copy>"]  # sentinel argv: the agent image's copy step, done in-process
_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Every process group this module started, so nothing outlives the test process.
_LIVE_GROUPS: set[int] = set()


@atexit.register
def _kill_leftovers() -> None:
    for pgid in list(_LIVE_GROUPS):
        _killpg(pgid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- pure helpers ----------------------------------------------------------------------------------


def rewrite_paths(text: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """Replace each container path under a mount by the host directory standing in for it.

    ``mounts`` is ``(mountPath, host dir)``; longer mount paths win. A mount path matches only as
    a whole path (``/share`` in ``/share/x`` or ``--dir=/share``, not in ``/shared`` or ``/a/share``).
    """
    for mount_path, host in sorted(mounts, key=lambda m: len(m[0]), reverse=True):
        mp = mount_path.rstrip("/")
        if not mp:
            continue
        pattern = re.compile(r"(?<![\w.\-~])" + re.escape(mp) + r"(?![\w.\-])")
        text = pattern.sub(lambda _m, h=str(host): h, text)
    return text


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; unknown references stay as they are)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(sub, text)


def normalize_image(image: str) -> str:
    """``busybox`` -> ``docker.io/library/busybox:latest`` (how a runtime names an image)."""
    name, digest = [*image.split("@", 1), ""][:2]
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    if digest:
        return f"{name}@{digest}"
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name


def _strip_tini(argv: list[str]) -> list[str]:
    """The program tini would run: drop ``tini`` and its options (``--`` ends them)."""
    if not argv or os.path.basename(argv[0]) != "tini":
        return argv
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        if rest.pop(0) == "--":
            break
    return rest


def translate_argv(argv: list[str], pod_ip: str) -> list[str]:
    """Map the agent image's programs onto this host (see the module docstring)."""
    prog = _strip_tini(argv)
    if not prog:
        return argv
    base = os.path.basename(prog[0])
    if base in ("agent", "pko-agent"):
        args = prog[1:]
        if args and args[0] == "--":
            args = args[1:]
        if args and args[0] == "serve":
            rest: list[str] = []
            skip = False
            for a in args[1:]:
                if skip:
                    skip = False
                elif a == "--host":
                    skip = True
                elif not a.startswith("--host="):
                    rest.append(a)
            args = ["serve", "--host", pod_ip, *rest]
        return [sys.executable, "-m", "pko.agent", *args]
    if base == "cp" and any(
        a.startswith("/") and os.path.basename(a) in ("agent", "tini") for a in prog[1:-1]
    ):
        return [*_BOOTSTRAP, prog[-1]]
    return prog


def tail(text: str, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``text``, then at most its last ``max_bytes`` bytes."""
    kept = "\n".join(text.splitlines()[-lines:])
    raw = kept.encode()
    if len(raw) > max_bytes:
        kept = raw[-max_bytes:].decode(errors="replace")
    return kept


class _IPs:
    """Loopback pod IPs: a random second octet per process (parallel test runs rarely meet), never reused,
    skipping any address whose agent port something already holds."""

    def __init__(self) -> None:
        self._second = random.randint(16, 239)
        self._n = 0

    def next(self, port: int = AGENT_PORT) -> str:
        while True:
            self._n += 1
            second = self._second + self._n // 62500
            rest = self._n % 62500
            ip = f"127.{second}.{rest // 250}.{rest % 250 + 1}"
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((ip, port))
                except OSError:
                    continue
            return ip


_IP_POOL = _IPs()


class _ConfigError(Exception):
    """A container's configuration cannot be resolved (CreateContainerConfigError)."""


# -- one container's runtime state -----------------------------------------------------------------


@dataclass
class _Container:
    spec: Obj
    init: bool
    state: Obj
    image: str
    last_state: Obj = field(default_factory=dict)
    restarts: int = 0
    ready: bool = False
    started: bool = False
    image_id: str = ""
    container_id: str = ""
    proc: asyncio.subprocess.Process | None = None
    attempts: int = 0
    failures: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.init and self.spec.get("restartPolicy") == "Always"

    def status(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "restartCount": self.restarts,
            "image": self.image,
            "imageID": self.image_id,
            "started": self.started,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


# -- one pod ---------------------------------------------------------------------------------------


class _PodRunner:
    """Plays the kubelet for one pod (one uid): schedule, sandbox, init, main, termination."""

    def __init__(self, kubelet: PlayKubelet, pod: Obj, index: int) -> None:
        self.k = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.key = f"{self.namespace}/{self.name}"
        self.dir = kubelet.root / "pods" / f"{index}-{self.name}"[:60]
        self.ip: str | None = None
        self.start_time: str | None = None
        self.initialized = False
        self.stopping = asyncio.Event()
        self.terminating = False
        self.gone = False  # the pod no longer exists: no more API writes
        self.volume_paths: dict[str, Path] = {}
        self.kubeconfig: Path | None = None
        self._lock = asyncio.Lock()
        self._cond_times: dict[str, tuple[str, str]] = {}
        spec = pod.get("spec") or {}
        init_waiting = {"waiting": {"reason": "PodInitializing"}}
        main_waiting = {
            "waiting": {"reason": "PodInitializing" if spec.get("initContainers") else "ContainerCreating"}
        }
        self.init = [
            _Container(c, True, dict(init_waiting), c.get("image", ""))
            for c in spec.get("initContainers") or []
        ]
        self.main = [
            _Container(c, False, dict(main_waiting), c.get("image", "")) for c in spec.get("containers") or []
        ]
        self.task = asyncio.create_task(self._run(), name=f"kubelet:{self.key}")
        self._termination: asyncio.Task[None] | None = None

    # -- events from the watch

    def update(self, pod: Obj) -> None:
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self.terminating:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            self._termination = asyncio.create_task(
                self.terminate(float(grace)), name=f"kubelet:stop:{self.key}"
            )

    async def vanish(self) -> None:
        """The pod is gone from the API (or the harness stops): kill everything, write nothing."""
        self.gone = True
        self.stopping.set()
        for c in self.containers:
            if c.proc is not None:
                _killpg(c.proc.pid, signal.SIGKILL)
        await self._join(10.0)
        if self._termination is not None and not self._termination.done():
            self._termination.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._termination

    @property
    def containers(self) -> list[_Container]:
        return [*self.init, *self.main]

    def container(self, name: str) -> _Container | None:
        return next((c for c in self.containers if c.name == name), None)

    # -- lifecycle

    async def _run(self) -> None:
        try:
            if not await self._schedule():
                return
            self.ip = _IP_POOL.next()
            self.start_time = _now()
            log.info("pod %s: sandbox ready with IP %s", self.key, self.ip)
            await self._push()
            if not await self._prepare():
                return
            if not await self._run_init():
                return
            self.initialized = True
            for c in self.main:
                c.task = asyncio.create_task(self._main_loop(c), name=f"kubelet:{self.key}:{c.name}")
            await self._push()
            await self.stopping.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s: the play-kubelet failed", self.key)

    async def _schedule(self) -> bool:
        spec = self.pod.get("spec") or {}
        if spec.get("nodeName"):
            return True
        written = False
        while self.k.is_unschedulable(self.key):
            if not written:
                message = self.k.unschedulable_message(self.key)
                await self._write_status({"phase": "Pending", "conditions": [self._unschedulable(message)]})
                written = True
            if await self._sleep(0.2):
                return False
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.k.node_name},
        }
        while not self.stopping.is_set():
            try:
                await client.CoreV1Api(self.k.api).create_namespaced_pod_binding(
                    self.name, self.namespace, binding, _preload_content=False
                )
                return True
            except ApiException as exc:
                if exc.status in (404, 409):  # gone, or bound meanwhile (409): nothing to run here
                    log.info("pod %s: binding refused (%s)", self.key, exc.status)
                    return exc.status == 409 and self._bound_here()
                log.warning("pod %s: binding failed: %s", self.key, exc)
            await self._sleep(1.0)
        return False

    def _bound_here(self) -> bool:
        return (self.pod.get("spec") or {}).get("nodeName") in (None, "", self.k.node_name)

    def _unschedulable(self, message: str) -> Obj:
        return {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": _now(),
        }

    async def _prepare(self) -> bool:
        """Volumes and the pod's kube identity; retried (as FailedMount is) until they can be made."""
        delay = self.k.backoff
        while not self.stopping.is_set():
            try:
                await self._make_volumes()
                if any(
                    (m.get("mountPath") or "").rstrip("/") == SA_TOKEN_PATH
                    for c in self.containers
                    for m in c.spec.get("volumeMounts") or []
                ):
                    await self._make_kubeconfig()
                return True
            except (ApiException, _ConfigError) as exc:
                log.warning("pod %s: MountVolume failed: %s", self.key, exc)
            if await self._sleep(delay):
                return False
            delay = min(delay * 2, self.k.max_backoff)
        return False

    async def _run_init(self) -> bool:
        for c in self.init:
            if c.sidecar:
                c.task = asyncio.create_task(self._main_loop(c), name=f"kubelet:{self.key}:{c.name}")
                while not c.started:
                    if await self._sleep(0.1):
                        return False
                continue
            while True:
                if not await self._pull(c):
                    return False
                code = await self._attempt(c)
                if code is None or self.stopping.is_set():
                    return False
                if code == 0:
                    c.failures = 0
                    break
                if (self.pod.get("spec") or {}).get("restartPolicy") == "Never":
                    await self._push(phase="Failed")
                    return False
                if await self._crash_backoff(c):
                    return False
        return True

    async def _main_loop(self, c: _Container) -> None:
        try:
            while not self.stopping.is_set():
                if not await self._pull(c):
                    return
                code = await self._attempt(c)
                if code is None or self.stopping.is_set():
                    return
                policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
                if not c.sidecar and (policy == "Never" or (policy == "OnFailure" and code == 0)):
                    return
                if await self._crash_backoff(c):
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s: container %s: the play-kubelet failed", self.key, c.name)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless the pod stops meanwhile; True when it is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    # -- images

    def _spec_image(self, c: _Container) -> str:
        spec = self.pod.get("spec") or {}
        for s in (spec.get("initContainers") if c.init else spec.get("containers")) or []:
            if s.get("name") == c.name:
                return str(s.get("image", ""))
        return c.image

    async def _pull(self, c: _Container) -> bool:
        n = 0
        while not self.stopping.is_set():
            c.image = self._spec_image(c)
            if self.k.image_known(c.image):
                ref = normalize_image(c.image)
                c.image_id = (
                    f"{ref.split('@')[0].rsplit(':', 1)[0]}@sha256:{hashlib.sha256(ref.encode()).hexdigest()}"
                )
                return True
            ref = normalize_image(c.image)
            c.state = {
                "waiting": {
                    "reason": "ErrImagePull",
                    "message": f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
                    f'failed to resolve reference "{ref}": {ref}: not found',
                }
            }
            await self._push()
            if await self._sleep(min(0.5, self.k.backoff)):
                break
            c.state = {
                "waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{c.image}"'}
            }
            await self._push()
            if await self._sleep(min(self.k.backoff * 2**n, self.k.max_backoff)):
                break
            n += 1
        return False

    # -- running a container

    def _mounts(self, c: _Container) -> list[tuple[str, Path]]:
        out: list[tuple[str, Path]] = []
        for m in c.spec.get("volumeMounts") or []:
            host = self.volume_paths.get(m.get("name", ""))
            if host is None:
                continue
            if m.get("subPath"):
                host = host / m["subPath"]
                host.mkdir(parents=True, exist_ok=True)
            out.append((str(m["mountPath"]), host))
        return out

    def _workdir(self, c: _Container, mounts: list[tuple[str, Path]]) -> Path:
        wd = c.spec.get("workingDir")
        if not wd:
            path = self.dir / "rootfs" / c.name
        else:
            rewritten = rewrite_paths(wd, mounts)
            path = Path(rewritten) if rewritten != wd else self.dir / "rootfs" / c.name / wd.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)  # a runtime creates a missing working directory
        return path

    async def _env(self, c: _Container, mounts: list[tuple[str, Path]]) -> dict[str, str]:
        """The process environment: host basics, the image's env, then the container's (which wins)."""
        server = urlsplit(self.k.server)
        env: dict[str, str] = {
            "PATH": ":".join([*map(str, self.k.pulumi.path_dirs), _BASE_PATH]),
            "HOSTNAME": self.name,
            "HOME": str(self.dir / "home" / c.name),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(server.port or 443),
            **self.k.image_environment(self.dir / "pulumi-home"),
        }
        _mkdir(Path(env["HOME"]))
        if self.kubeconfig is not None and any(m[0].rstrip("/") == SA_TOKEN_PATH for m in mounts):
            env["KUBECONFIG"] = str(self.kubeconfig)
        own: dict[str, str] = {}
        for source in c.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            data = await self._env_source(source)
            for k, v in data.items():
                own[prefix + k] = v
        for var in c.spec.get("env") or []:
            name = var["name"]
            if "valueFrom" in var:
                value = await self._value_from(c, var["valueFrom"])
                if value is None:
                    continue
                own[name] = value
            else:
                own[name] = expand_vars(rewrite_paths(str(var.get("value", "")), mounts), {**env, **own})
        env.update(own)
        return env

    async def _env_source(self, source: Obj) -> dict[str, str]:
        for kind, resource in (("configMapRef", CONFIGMAPS), ("secretRef", SECRETS)):
            ref = source.get(kind)
            if ref is None:
                continue
            obj = await self._read(resource, ref["name"], bool(ref.get("optional")))
            if obj is None:
                return {}
            return _data(obj)
        return {}

    async def _read(self, resource: Any, name: str, optional: bool) -> Obj | None:
        try:
            return await ResourceClient(self.k.api, resource, self.namespace).get(name)
        except ApiException as exc:
            if exc.status == 404:
                if optional:
                    return None
                raise _ConfigError(f'{resource.kind.lower()} "{name}" not found') from None
            raise

    async def _value_from(self, c: _Container, source: Obj) -> str | None:
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return self._resource_field(c, source["resourceFieldRef"])
        for kind, resource in (("configMapKeyRef", CONFIGMAPS), ("secretKeyRef", SECRETS)):
            ref = source.get(kind)
            if ref is None:
                continue
            optional = bool(ref.get("optional"))
            obj = await self._read(resource, ref["name"], optional)
            if obj is None:
                return None
            data = _data(obj)
            if ref["key"] not in data:
                if optional:
                    return None
                raise _ConfigError(
                    f"couldn't find key {ref['key']} in {resource.kind} {self.namespace}/{ref['name']}"
                )
            return data[ref["key"]]
        return None

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        spec = self.pod.get("spec") or {}
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        values = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.k.node_name,
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.hostIP": "127.0.0.1",
            "status.podIP": self.ip or "",
            "status.podIPs": self.ip or "",
        }
        if path not in values:
            raise _ConfigError(f"unsupported fieldPath {path!r}")
        return values[path]

    def _resource_field(self, c: _Container, ref: Obj) -> str:
        target = self.container(ref.get("containerName") or c.name) or c
        resources = target.spec.get("resources") or {}
        kind, _, res = str(ref["resource"]).partition(".")
        node = {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "100Gi"}
        raw = (resources.get(kind) or {}).get(res)
        if raw is None and kind == "requests":
            raw = (resources.get("limits") or {}).get(res, "0")
        if raw is None:
            raw = node.get(res, "0")
        divisor = parse_quantity(ref.get("divisor") or "1") or Decimal(1)  # the apiserver defaults it to "0"
        value = parse_quantity(raw) / divisor
        return str(int(value.to_integral_value(rounding=ROUND_CEILING)))

    def _argv(self, c: _Container, env: Mapping[str, str], mounts: list[tuple[str, Path]]) -> list[str]:
        command = c.spec.get("command") or []
        args = c.spec.get("args")
        entrypoint, cmd = self.k.image_config.get(c.image, ([], []))
        argv = [*command, *(args or [])] if command else [*entrypoint, *(args if args is not None else cmd)]
        argv = [expand_vars(rewrite_paths(a, mounts), env) for a in argv]
        if not argv:
            return list(_SLEEP_FOREVER)
        return translate_argv(argv, self.ip or "127.0.0.1")

    async def _attempt(self, c: _Container) -> int | None:
        """Run the container once; its exit code, or None when the pod stops first.

        A container whose env or command cannot be resolved (a missing Secret key...) is not created:
        ``CreateContainerConfigError``, retried with back-off, as a kubelet does.
        """
        while True:
            mounts = self._mounts(c)
            try:
                env = await self._env(c, mounts)
                argv = self._argv(c, env, mounts)
                cwd = self._workdir(c, mounts)
                break
            except Exception as exc:
                if not isinstance(exc, _ConfigError | ApiException):
                    log.exception("pod %s: container %s: cannot build its process", self.key, c.name)
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                await self._push()
                c.failures += 1
                if await self._sleep(min(self.k.backoff * 2 ** (c.failures - 1), self.k.max_backoff)):
                    return None
        if self.stopping.is_set():
            return None
        if c.container_id:
            c.restarts += 1
        logs = self.dir / "logs" / c.name
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{c.attempts}.log"
        c.attempts += 1
        started_at, started_mono = _now(), time.monotonic()
        c.container_id = f"containerd://{secrets.token_hex(32)}"
        probe_task: asyncio.Task[None] | None = None
        if argv[: len(_BOOTSTRAP)] == _BOOTSTRAP:
            code = _bootstrap_copy(Path(argv[-1]), log_path)
        else:
            with _open_log(log_path) as out:
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *argv,
                        cwd=cwd,
                        env=env,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out,
                        stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True,
                    )
                except OSError as exc:
                    c.state = {
                        "terminated": {
                            "exitCode": 128,
                            "reason": "StartError",
                            "message": f"failed to create containerd task: exec: {argv[0]!r}: {exc.strerror}",
                            "startedAt": started_at,
                            "finishedAt": _now(),
                            "containerID": c.container_id,
                        }
                    }
                    await self._push()
                    return 128
            c.proc = proc
            _LIVE_GROUPS.add(proc.pid)
            if self.stopping.is_set():
                _killpg(proc.pid, signal.SIGTERM)
            log.info(
                "pod %s: container %s started (pid %d): %s", self.key, c.name, proc.pid, shlex.join(argv)
            )
            c.started = True
            c.state = {"running": {"startedAt": started_at}}
            probe = c.spec.get("readinessProbe")
            if probe and not c.init:
                probe_task = asyncio.create_task(self._probe_loop(c, probe, env, cwd, mounts))
            else:
                c.ready = not c.init
            await self._push()
            rc = await proc.wait()
            _killpg(proc.pid, signal.SIGKILL)  # the container's other processes end with it
            _LIVE_GROUPS.discard(proc.pid)
            c.proc = None
            code = rc if rc >= 0 else 128 - rc
        if probe_task is not None:
            probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe_task
        if time.monotonic() - started_mono > 10 * self.k.max_backoff:
            c.failures = 0  # as the kubelet forgets back-off after a long enough run
        terminated: Obj = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": _now(),
            "containerID": c.container_id,
        }
        message = self._termination_message(c, code, log_path, mounts)
        if message:
            terminated["message"] = message
        c.started = False
        c.ready = c.init and code == 0
        c.state = {"terminated": terminated}
        log.info("pod %s: container %s exited with %d", self.key, c.name, code)
        await self._push()
        return code

    def _termination_message(
        self, c: _Container, code: int, log_path: Path, mounts: list[tuple[str, Path]]
    ) -> str:
        path = c.spec.get("terminationMessagePath") or "/dev/termination-log"
        host = rewrite_paths(path, mounts)
        if host != path:
            with contextlib.suppress(OSError):
                text = Path(host).read_text(errors="replace")[:4096]
                if text:
                    return text
        if c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError" and code != 0:
            return tail(log_path.read_text(errors="replace"))
        return ""

    async def _crash_backoff(self, c: _Container) -> bool:
        """CrashLoopBackOff until the restart; True when the pod stops meanwhile."""
        c.failures += 1
        delay = min(self.k.backoff * 2 ** (c.failures - 1), self.k.max_backoff)
        c.last_state = c.state
        c.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={c.name} "
                f"pod={self.name}_{self.namespace}({self.uid})",
            }
        }
        await self._push()
        return await self._sleep(delay)

    # -- readiness probes

    async def _probe_loop(
        self, c: _Container, probe: Obj, env: Mapping[str, str], cwd: Path, mounts: list[tuple[str, Path]]
    ) -> None:
        await asyncio.sleep(min(float(probe.get("initialDelaySeconds", 0)), 1.0))
        period = min(float(probe.get("periodSeconds", 10)), 0.5)
        successes = failures = 0
        while True:
            ok = await self._probe(c, probe, env, cwd, mounts)
            if ok:
                successes, failures = successes + 1, 0
                if not c.ready and successes >= int(probe.get("successThreshold", 1)):
                    c.ready = True
                    await self._push()
            else:
                successes, failures = 0, failures + 1
                if c.ready and failures >= int(probe.get("failureThreshold", 3)):
                    c.ready = False
                    await self._push()
            await asyncio.sleep(period)

    def _port(self, c: _Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no port named {port}")

    async def _probe(
        self, c: _Container, probe: Obj, env: Mapping[str, str], cwd: Path, mounts: list[tuple[str, Path]]
    ) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        ip = self.ip or "127.0.0.1"
        try:
            if "tcpSocket" in probe:
                port = self._port(c, probe["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
                writer.close()
                return True
            if "grpc" in probe:
                from grpclib.client import Channel
                from grpclib.health.v1.health_grpc import HealthStub
                from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

                channel = Channel(ip, self._port(c, probe["grpc"]["port"]))
                try:
                    req = HealthCheckRequest(service=probe["grpc"].get("service", ""))
                    resp = await asyncio.wait_for(HealthStub(channel).Check(req), timeout)
                    return bool(resp.status == HealthCheckResponse.SERVING)
                finally:
                    channel.close()
            if "httpGet" in probe:
                import aiohttp

                get = probe["httpGet"]
                port = self._port(c, get["port"])
                url = f"{get.get('scheme', 'HTTP').lower()}://{ip}:{port}{get.get('path', '/')}"
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                    session.get(url, ssl=False) as resp,
                ):
                    return 200 <= resp.status < 400
            if "exec" in probe:
                argv = [
                    expand_vars(rewrite_paths(a, mounts), env) for a in probe["exec"].get("command") or []
                ]
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=dict(env),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    return await asyncio.wait_for(proc.wait(), timeout) == 0
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                    return False
        except Exception:  # any failure is a failed probe
            return False
        return True

    # -- volumes and identity

    async def _make_volumes(self) -> None:
        for vol in (self.pod.get("spec") or {}).get("volumes") or []:
            name = vol["name"]
            path = self.dir / "volumes" / name
            if "persistentVolumeClaim" in vol:
                path = self.k.root / "pvc" / self.namespace / vol["persistentVolumeClaim"]["claimName"]
            path.mkdir(parents=True, exist_ok=True)
            self.volume_paths[name] = path
            if "secret" in vol:
                src = vol["secret"]
                obj = await self._read(SECRETS, src["secretName"], bool(src.get("optional")))
                _write_items(path, _data(obj) if obj else {}, src.get("items"))
            elif "configMap" in vol:
                src = vol["configMap"]
                obj = await self._read(CONFIGMAPS, src["name"], bool(src.get("optional")))
                _write_items(path, _data(obj) if obj else {}, src.get("items"))
            elif "downwardAPI" in vol:
                self._write_downward(path, vol["downwardAPI"].get("items") or [])
            elif "projected" in vol:
                for source in vol["projected"].get("sources") or []:
                    await self._write_projection(path, source)

    def _write_downward(self, path: Path, items: list[Obj]) -> None:
        for item in items:
            if "fieldRef" in item:
                value = self._field(item["fieldRef"]["fieldPath"])
            else:
                value = self._resource_field(self.main[0], item["resourceFieldRef"])
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value)

    async def _write_projection(self, path: Path, source: Obj) -> None:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            audiences = [sat["audience"]] if sat.get("audience") else None
            token = await self._mint(audiences, int(sat.get("expirationSeconds", 3607)))
            (path / sat.get("path", "token")).write_text(token)
        elif "secret" in source or "configMap" in source:
            kind, resource = ("secret", SECRETS) if "secret" in source else ("configMap", CONFIGMAPS)
            src = source[kind]
            obj = await self._read(resource, src["name"], bool(src.get("optional")))
            _write_items(path, _data(obj) if obj else {}, src.get("items"))
        elif "downwardAPI" in source:
            self._write_downward(path, source["downwardAPI"].get("items") or [])

    async def _mint(self, audiences: list[str] | None, expiration: int = 3607) -> str:
        """A TokenRequest token for the pod's service account, bound to this pod (as the kubelet gets one)."""
        sa = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        spec: Obj = {
            "expirationSeconds": expiration,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
        }
        if audiences:
            spec["audiences"] = audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        resp = await client.CoreV1Api(self.k.api).create_namespaced_service_account_token(
            sa, self.namespace, body, _preload_content=False
        )
        return str(json.loads(await resp.read())["status"]["token"])

    async def _make_kubeconfig(self) -> None:
        token = await self._mint(None)
        ca = base64.b64encode(self.k.ca_file.read_bytes()).decode()
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "in-cluster", "cluster": {"server": self.k.server, "certificate-authority-data": ca}}
            ],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {"cluster": "in-cluster", "user": "pod", "namespace": self.namespace},
                }
            ],
            "current-context": "in-cluster",
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "kubeconfig"
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)
        self.kubeconfig = path

    # -- status

    def _condition(self, type_: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        status = "True" if ok else "False"
        prev = self._cond_times.get(type_)
        when = prev[1] if prev and prev[0] == status else _now()
        self._cond_times[type_] = (status, when)
        cond: Obj = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": when}
        if not ok:
            cond["reason"], cond["message"] = reason, message
        return cond

    def _status(self, phase: str | None = None) -> Obj:
        current = self.pod.get("status") or {}
        kept = {"Initialized", "Ready", "ContainersReady", "PodScheduled"}
        conditions = [c for c in current.get("conditions") or [] if c.get("type") not in kept]
        scheduled = next(
            (c for c in current.get("conditions") or [] if c.get("type") == "PodScheduled"), None
        )
        if scheduled is None or scheduled.get("status") != "True":
            scheduled = {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": _now(),
            }
        pending_init = [c.name for c in self.init if not (c.ready or (c.sidecar and c.started))]
        unready = [c.name for c in self.main if not c.ready]
        all_ready = not unready and not pending_init
        gates = (self.pod.get("spec") or {}).get("readinessGates") or []
        gates_ok = all(
            any(x.get("type") == g.get("conditionType") and x.get("status") == "True" for x in conditions)
            for g in gates
        )
        conditions = [
            self._condition(
                "Initialized",
                not pending_init,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(pending_init)}]",
            ),
            self._condition(
                "Ready",
                all_ready and gates_ok,
                "ContainersNotReady" if not all_ready else "ReadinessGatesNotReady",
                f"containers with unready status: [{' '.join(unready)}]"
                if not all_ready
                else "corresponding condition of pod readiness gate is not true",
            ),
            self._condition(
                "ContainersReady",
                all_ready,
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(unready)}]",
            ),
            scheduled,
            *conditions,
        ]
        if phase is None:
            phase = "Running" if self.initialized and any(c.container_id for c in self.main) else "Pending"
        status: Obj = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "startTime": self.start_time,
            "containerStatuses": [c.status() for c in self.main],
        }
        if self.ip:
            status["podIP"] = self.ip
            status["podIPs"] = [{"ip": self.ip}]
        if self.init:
            status["initContainerStatuses"] = [c.status() for c in self.init]
        if current.get("qosClass"):
            status["qosClass"] = current["qosClass"]
        return status

    async def _push(self, phase: str | None = None) -> None:
        async with self._lock:
            if not self.gone:
                await self._write_status(self._status(phase))

    async def _write_status(self, status: Obj) -> None:
        if self.gone:
            return
        if not status.get("qosClass") and (self.pod.get("status") or {}).get("qosClass"):
            status["qosClass"] = self.pod["status"]["qosClass"]
        pods = ResourceClient(self.k.api, PODS, self.namespace)
        for attempt in range(5):
            try:
                self.pod = await pods.patch(
                    self.name,
                    [{"op": "add", "path": "/status", "value": status}],
                    patch_type="json",
                    subresource="status",
                )
                if self.pod["metadata"]["uid"] != self.uid:  # a replacement with the same name: not ours
                    self.gone = True
                    self.stopping.set()
                return
            except ApiException as exc:
                if exc.status == 404:
                    self.gone = True
                    self.stopping.set()
                    return
                log.warning("pod %s: status write failed (%s): %s", self.key, exc.status, exc.reason)
            except Exception as exc:
                log.warning("pod %s: status write failed: %r", self.key, exc)
            await asyncio.sleep(0.2 * (attempt + 1))

    # -- termination

    async def terminate(self, grace: float) -> None:
        """SIGTERM, wait up to the grace period, SIGKILL, then finish the deletion (grace 0)."""
        self.terminating = True
        self.stopping.set()
        if self.k.max_grace is not None:
            grace = min(grace, self.k.max_grace)
        procs = [c.proc for c in self.containers if c.proc is not None]
        log.info("pod %s: terminating %d process(es), grace %gs", self.key, len(procs), grace)
        for p in procs:
            _killpg(p.pid, signal.SIGTERM)
        if procs:
            try:
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace)
            except TimeoutError:
                for p in procs:
                    _killpg(p.pid, signal.SIGKILL)
        await self._join(30.0)
        await self._push()
        if self.gone:
            return
        try:
            await client.CoreV1Api(self.k.api).delete_namespaced_pod(
                self.name,
                self.namespace,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                grace_period_seconds=0,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s: final delete failed: %s", self.key, exc)
        self.gone = True

    async def _join(self, timeout: float) -> None:  # noqa: ASYNC109 - a bound on joining, not an error
        tasks = [t for t in (self.task, *(c.task for c in self.containers)) if t is not None and not t.done()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _open_log(path: Path) -> IO[bytes]:
    return open(path, "wb")


def _data(obj: Obj) -> dict[str, str]:
    """A Secret's or ConfigMap's entries as text."""
    out = {k: str(v) for k, v in (obj.get("data") or {}).items()} if obj.get("kind") == "ConfigMap" else {}
    if obj.get("kind") == "Secret":
        for k, v in (obj.get("data") or {}).items():
            out[k] = base64.b64decode(v).decode(errors="replace")
        out.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
    for k, v in (obj.get("binaryData") or {}).items():
        out[k] = base64.b64decode(v).decode(errors="replace")
    return out


def _write_items(path: Path, data: Mapping[str, str], items: list[Obj] | None) -> None:
    pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    for key, rel in pairs:
        if key not in data:
            raise _ConfigError(f"configmap/secret has no key {key!r}")
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[key])


def _bootstrap_copy(dest: Path, log_path: Path) -> int:
    """The agent image's ``cp -r /agent /agent-lib /tini /share/``: shims that run this checkout's agent."""
    dest.mkdir(parents=True, exist_ok=True)
    agent = dest / "agent"
    agent.write_text(
        f'#!/bin/sh\n[ "$1" = "--" ] && shift\nexec {shlex.quote(sys.executable)} -m pko.agent "$@"\n'
    )
    tini = dest / "tini"
    tini.write_text(
        "#!/bin/sh\n"
        'while [ "${1#-}" != "$1" ]; do [ "$1" = "--" ] && { shift; break; }; shift; done\n'
        'exec "$@"\n'
    )
    for f in (agent, tini):
        f.chmod(0o755)
    log_path.write_text("")
    return 0


# -- the harness -----------------------------------------------------------------------------------


ImagePredicate = Callable[[str], bool]


class PlayKubelet:
    """Plays the kubelet (and the scheduler's binding) for workspace pods in ``namespaces``.

    Use as ``async with PlayKubelet(...) as kubelet:`` or ``start()``/``stop()``. Pod keys are
    ``"<namespace>/<name>"``. ``images``: the images that "exist" (a collection, matched after
    normalisation, so ``busybox`` is ``docker.io/library/busybox:latest``), or a predicate; None: all.
    ``image_config`` gives an image's ``(entrypoint, cmd)`` for containers that set no command.
    ``image_env`` is added to every container's image environment (e.g. ``PULUMI_FAKE_VERSION``).
    ``backoff``/``max_backoff``: the restart and image-pull back-off (the kubelet's 10 s / 5 min,
    shortened). ``max_grace`` caps a deletion's grace period (None: honoured as given). ``engine``
    makes the Pulumi engine the pods run (the stand-in by default; ``make_real_pulumi`` for the real one).
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespaces: Iterable[str],
        *,
        root: Path,
        server: str,
        ca_file: Path,
        images: Iterable[str] | ImagePredicate | None = None,
        image_config: Mapping[str, tuple[list[str], list[str]]] | None = None,
        image_env: Mapping[str, str] | None = None,
        label_selector: str = WORKSPACE_SELECTOR,
        node_name: str = NODE_NAME,
        backoff: float = 0.5,
        max_backoff: float = 5.0,
        max_grace: float | None = None,
        engine: Callable[[Path], FakePulumi] = make_fake_pulumi,
    ) -> None:
        self.api = api
        self.namespaces: set[str] = set(namespaces)
        self.root = Path(root)
        self.server = server
        self.ca_file = Path(ca_file)
        self.image_predicate: ImagePredicate | None = None
        self.images: set[str] | None = None
        if callable(images):
            self.image_predicate = images
        elif images is not None:
            self.images = set(images)
        self.image_config: dict[str, tuple[list[str], list[str]]] = dict(image_config or {})
        self.image_env: dict[str, str] = dict(image_env or {})
        self.label_selector = label_selector
        self.node_name = node_name
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_grace = max_grace
        self.root.mkdir(parents=True, exist_ok=True)
        self.pulumi: FakePulumi = engine(self.root / "pulumi")
        self._runners: dict[str, _PodRunner] = {}  # by uid, until the pod is deleted
        self._by_key: dict[str, _PodRunner] = {}  # the latest runner of each pod key
        self._unschedulable: dict[str, str] = {}
        self._count = 0
        self._watch: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    # -- lifecycle

    async def __aenter__(self) -> PlayKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await self._ensure_node()
        self._watch = asyncio.create_task(self._watch_loop(), name="kubelet:watch")
        await asyncio.wait_for(self._synced.wait(), 60)

    async def stop(self, *, release_pods: bool = True) -> None:
        """Stop watching and kill every process this harness started; with ``release_pods``, delete the
        pods it ran (grace 0), as when a node is removed."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        runners = list(self._runners.values())
        self._runners.clear()
        await asyncio.gather(*(r.vanish() for r in runners), return_exceptions=True)
        if release_pods:
            # The node is gone: its pods are deleted at once (grace 0), so a namespace deleted after the
            # test does not wait forever for a kubelet to confirm their termination.
            core = client.CoreV1Api(self.api)
            for r in runners:
                with contextlib.suppress(ApiException):
                    await core.delete_namespaced_pod(
                        r.name,
                        r.namespace,
                        body={"gracePeriodSeconds": 0, "preconditions": {"uid": r.uid}},
                        grace_period_seconds=0,
                        _preload_content=False,
                    )

    async def _ensure_node(self) -> None:
        core = client.CoreV1Api(self.api)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
        }
        try:
            await core.create_node(node, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
        status = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "play-kubelet is posting ready status",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node_name},
                ],
                "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            }
        }
        with contextlib.suppress(ApiException):
            await core.patch_node_status(self.node_name, status, _preload_content=False)

    # -- watch

    async def _watch_loop(self) -> None:
        pods = ResourceClient(self.api, PODS)
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    listed = await pods.list(label_selector=self.label_selector)
                    seen = {p["metadata"]["uid"] for p in listed.items}
                    for uid in [u for u in self._runners if u not in seen]:
                        await self._on_deleted(uid)
                    for p in listed.items:
                        await self._on_pod(p)
                    rv = listed.resource_version
                    self._synced.set()
                async with pods.watch(
                    resource_version=rv, timeout_seconds=240, label_selector=self.label_selector
                ) as events:
                    async for ev in events:
                        rv = str(ev.object.get("metadata", {}).get("resourceVersion") or rv)
                        if ev.type == "DELETED":
                            await self._on_deleted(ev.object["metadata"]["uid"])
                        elif ev.type in ("ADDED", "MODIFIED"):
                            await self._on_pod(ev.object)
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                else:
                    log.warning("pod watch failed: %s", exc)
                    await asyncio.sleep(0.5)
            except Exception as exc:
                log.warning("pod watch failed: %r", exc)
                await asyncio.sleep(0.5)

    async def _on_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        if meta.get("namespace") not in self.namespaces:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node != self.node_name:
            return
        uid = meta["uid"]
        runner = self._runners.get(uid)
        if runner is not None:
            runner.update(pod)
            return
        key = f"{meta['namespace']}/{meta['name']}"
        if meta.get("deletionTimestamp"):
            return  # never ran here (an unbound pod is deleted at once by the apiserver)
        self._count += 1
        runner = _PodRunner(self, pod, self._count)
        self._runners[uid] = runner
        self._by_key[key] = runner
        log.info("pod %s (uid %s): accepted", key, uid)

    async def _on_deleted(self, uid: str) -> None:
        runner = self._runners.pop(uid, None)
        if runner is not None:
            log.info("pod %s (uid %s): deleted", runner.key, uid)
            await runner.vanish()

    # -- images

    def image_known(self, image: str) -> bool:
        if self.image_predicate is not None:
            return self.image_predicate(image)
        if self.images is None:
            return True
        return normalize_image(image) in {normalize_image(i) for i in self.images}

    def image_environment(self, pulumi_home: Path) -> dict[str, str]:
        """What the images' ENV would hold: the Pulumi engine's (PATH is set separately), with its
        plugins in the pod's PULUMI_HOME as an image has them."""
        self.pulumi.seed_home(pulumi_home)
        env = {k: v for k, v in self.pulumi.env.items() if k != "PATH"}
        env["PULUMI_HOME"] = str(pulumi_home)
        env.update(self.image_env)
        return env

    # -- test hooks

    def unschedulable(
        self, pod_key: str, message: str = "0/1 nodes are available: 1 Insufficient cpu."
    ) -> None:
        """Pods with this key that are not yet bound stay Pending with PodScheduled=False (Unschedulable)."""
        self._unschedulable[pod_key] = message

    def schedulable(self, pod_key: str) -> None:
        self._unschedulable.pop(pod_key, None)

    def is_unschedulable(self, pod_key: str) -> bool:
        return pod_key in self._unschedulable

    def unschedulable_message(self, pod_key: str) -> str:
        return self._unschedulable.get(pod_key, "")

    def kill(self, pod_key: str, container: str, sig: int = signal.SIGKILL) -> bool:
        """Signal a running container's process group (SIGKILL: exit code 137); False if not running."""
        runner = self._by_key.get(pod_key)
        c = runner.container(container) if runner else None
        if c is None or c.proc is None:
            return False
        log.info(
            "pod %s: killing container %s (pid %d) with %s",
            pod_key,
            container,
            c.proc.pid,
            signal.Signals(sig).name,
        )
        _killpg(c.proc.pid, sig)
        return True

    @property
    def processes(self) -> dict[str, dict[str, int]]:
        """Running processes: pod key -> container -> pid."""
        out: dict[str, dict[str, int]] = {}
        for r in self._runners.values():
            for c in r.containers:
                if c.proc is not None:
                    out.setdefault(r.key, {})[c.name] = c.proc.pid
        return out

    def pod_ip(self, pod_key: str) -> str | None:
        runner = self._by_key.get(pod_key)
        return runner.ip if runner else None

    def pod_dir(self, pod_key: str) -> Path | None:
        runner = self._by_key.get(pod_key)
        return runner.dir if runner else None

    def output(self, pod_key: str, container: str, *, previous: bool = False, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` of a container's output (``previous``: the run before the current one)."""
        runner = self._by_key.get(pod_key)
        c = runner.container(container) if runner else None
        if runner is None or c is None or c.attempts == 0:
            return ""
        index = c.attempts - (2 if previous else 1)
        if index < 0:
            return ""
        path = runner.dir / "logs" / container / f"{index}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def describe(self) -> str:
        """Every pod this harness ran: each container's state and last output lines (for failure messages)."""
        parts: list[str] = []
        for key, r in sorted(self._by_key.items()):
            parts.append(
                f"pod {key} uid={r.uid} ip={r.ip} initialized={r.initialized} stopping={r.stopping.is_set()}"
            )
            for c in r.containers:
                kind = "init " if c.init else ""
                parts.append(f"  {kind}{c.name}: restarts={c.restarts} ready={c.ready} {json.dumps(c.state)}")
                out = self.output(key, c.name, lines=15)
                if out:
                    parts.extend(f"    | {line}" for line in out.splitlines())
        return "\n".join(parts) or "(no pods)"

    async def wait_for(
        self,
        pod_key: str,
        predicate: Callable[[Obj], bool],
        *,
        timeout: float = 60.0,  # noqa: ASYNC109 - a deadline for polling the API
        what: str = "condition",
    ) -> Obj:
        """Poll the API until the pod ``pod_key`` satisfies ``predicate``; returns it."""
        ns, name = pod_key.split("/", 1)
        pods = ResourceClient(self.api, PODS, ns)
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        while True:
            try:
                last = await pods.get(name)
                if predicate(last):
                    return last
            except ApiException as exc:
                if exc.status != 404:
                    raise
                last = None
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pod {pod_key}: {what} not reached in {timeout}s; last status:\n"
                    f"{json.dumps((last or {}).get('status'), indent=1)}\n{self.describe()}"
                )
            await asyncio.sleep(0.2)

    async def wait_ready(self, pod_key: str, *, timeout: float = 60.0, uid: str | None = None) -> Obj:  # noqa: ASYNC109
        """Until the pod (optionally: the incarnation ``uid``) is Ready."""

        def ready(pod: Obj) -> bool:
            if uid is not None and pod["metadata"]["uid"] != uid:
                return False
            return any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )

        return await self.wait_for(pod_key, ready, timeout=timeout, what="Ready")


# -- cluster identities (for tests) ----------------------------------------------------------------


async def create_service_account(api: client.ApiClient, namespace: str, name: str) -> None:
    """Create a ServiceAccount (an existing one is fine)."""
    try:
        await client.CoreV1Api(api).create_namespaced_service_account(
            namespace, {"metadata": {"name": name}}, _preload_content=False
        )
    except ApiException as exc:
        if exc.status != 409:
            raise


async def mint_token(
    api: client.ApiClient,
    namespace: str,
    service_account: str,
    audience: str | None = None,
    expiration: int = 3600,
) -> str:
    """A TokenRequest token for ``service_account`` (``audience`` None: the apiserver's)."""
    spec: Obj = {"expirationSeconds": expiration}
    if audience:
        spec["audiences"] = [audience]
    resp = await client.CoreV1Api(api).create_namespaced_service_account_token(
        service_account, namespace, {"spec": spec}, _preload_content=False
    )
    return str(json.loads(await resp.read())["status"]["token"])


async def _create(call: Callable[..., Awaitable[Any]], *args: Any) -> None:
    try:
        await call(*args, _preload_content=False)
    except ApiException as exc:
        if exc.status != 409:
            raise


async def grant_auth_delegator(api: client.ApiClient, namespace: str, service_account: str) -> str:
    """Bind ``system:auth-delegator`` to a workspace's ServiceAccount (the agent's TokenReview and
    SubjectAccessReview need it, as upstream's docs require); returns the ClusterRoleBinding's name."""
    name = f"pko-auth-delegator-{namespace}-{service_account}"[:253]
    await _create(
        client.RbacAuthorizationV1Api(api).create_cluster_role_binding,
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    )
    return name


async def grant_workspace_rpc(
    api: client.ApiClient, namespace: str, workspace: str, service_account: str
) -> None:
    """Let ``service_account`` (in ``namespace``) ``use`` ``workspaces/rpc`` of ``workspace``: what the
    agent's SubjectAccessReview asks for a caller."""
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"workspace-rpc-{workspace}-{service_account}"[:253]
    await _create(
        rbac.create_namespaced_role,
        namespace,
        {
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": ["auto.pulumi.com"],
                    "resources": ["workspaces/rpc"],
                    "resourceNames": [workspace],
                    "verbs": ["use"],
                }
            ],
        },
    )
    await _create(
        rbac.create_namespaced_role_binding,
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    )
