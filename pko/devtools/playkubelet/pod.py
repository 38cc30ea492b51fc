"""One pod's life on the play-kubelet: scheduling, sandbox, image pulls, init and main containers
with their restarts and back-off, and termination (the package docstring's bullets, in that order)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import shlex
import signal
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from .podconfig import SA_TOKEN_PATH, PodConfig
from .probes import PodProbes
from .programs import BOOTSTRAP, bootstrap_copy, normalize_image, rewrite_paths, tail
from .runtime import IP_POOL, LIVE_GROUPS, ConfigError, Container, Obj, killpg, log, now

if TYPE_CHECKING:
    from .harness import PlayKubelet


class PodRunner(PodConfig, PodProbes):
    """Plays the kubelet for one pod (one uid): schedule, sandbox, init, main, termination."""

    def __init__(self, kubelet: PlayKubelet, pod: Obj, index: int) -> None:
        super().__init__(kubelet, pod, index)
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
                killpg(c.proc.pid, signal.SIGKILL)
        await self._join(10.0)
        if self._termination is not None and not self._termination.done():
            self._termination.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._termination

    # -- lifecycle

    async def _run(self) -> None:
        try:
            if not await self._schedule():
                return
            self.ip = IP_POOL.next()
            self.start_time = now()
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
        binding: Any = {
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
            "lastTransitionTime": now(),
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
            except (ApiException, ConfigError) as exc:
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

    async def _main_loop(self, c: Container) -> None:
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

    # -- images

    def _spec_image(self, c: Container) -> str:
        spec = self.pod.get("spec") or {}
        for s in (spec.get("initContainers") if c.init else spec.get("containers")) or []:
            if s.get("name") == c.name:
                return str(s.get("image", ""))
        return c.image

    async def _pull(self, c: Container) -> bool:
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

    async def _attempt(self, c: Container) -> int | None:
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
                if not isinstance(exc, ConfigError | ApiException):
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
        started_at, started_mono = now(), time.monotonic()
        c.container_id = f"containerd://{secrets.token_hex(32)}"
        probe_task: asyncio.Task[None] | None = None
        if argv[: len(BOOTSTRAP)] == BOOTSTRAP:
            code = bootstrap_copy(Path(argv[-1]), log_path)
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
                            "finishedAt": now(),
                            "containerID": c.container_id,
                        }
                    }
                    await self._push()
                    return 128
            c.proc = proc
            LIVE_GROUPS.add(proc.pid)
            if self.stopping.is_set():
                killpg(proc.pid, signal.SIGTERM)
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
            killpg(proc.pid, signal.SIGKILL)  # the container's other processes end with it
            LIVE_GROUPS.discard(proc.pid)
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
            "finishedAt": now(),
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
        self, c: Container, code: int, log_path: Path, mounts: list[tuple[str, Path]]
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

    async def _crash_backoff(self, c: Container) -> bool:
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
            killpg(p.pid, signal.SIGTERM)
        if procs:
            try:
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace)
            except TimeoutError:
                for p in procs:
                    killpg(p.pid, signal.SIGKILL)
        await self._join(30.0)
        await self._push()
        if self.gone:
            return
        try:
            await client.CoreV1Api(self.k.api).delete_namespaced_pod(
                self.name,
                self.namespace,
                body=cast(Any, {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}),
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


def _open_log(path: Path) -> IO[bytes]:
    return open(path, "wb")
