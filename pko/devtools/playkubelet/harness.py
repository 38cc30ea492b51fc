"""The play-kubelet itself: its Node, the pod watch that starts and stops a runner per pod, the
images it can "pull", and the hooks tests use (kill, unschedulable, output, wait_ready...)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.devtools.apiclient import BridgeClient
from pko.devtools.standin import FakePulumi, make_fake_pulumi
from pko.machinery.resource import PODS, ResourceClient

from .pod import PodRunner
from .programs import TAIL_LINES, normalize_image
from .runtime import Obj, killpg, log, now

WORKSPACE_SELECTOR = "auto.pulumi.com/component=workspace"
NODE_NAME = "play-kubelet"

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
        api: BridgeClient,
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
        self._runners: dict[str, PodRunner] = {}  # by uid, until the pod is deleted
        self._by_key: dict[str, PodRunner] = {}  # the latest runner of each pod key
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
                        body=cast(Any, {"gracePeriodSeconds": 0, "preconditions": {"uid": r.uid}}),
                        grace_period_seconds=0,
                        _preload_content=False,
                    )

    async def _ensure_node(self) -> None:
        core = client.CoreV1Api(self.api)
        node: Any = {
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
                        "lastHeartbeatTime": now(),
                        "lastTransitionTime": now(),
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
        runner = PodRunner(self, pod, self._count)
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
        killpg(c.proc.pid, sig)
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
