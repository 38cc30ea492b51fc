"""One pod's state as the play-kubelet holds it, and the pod status it writes from that state."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from kubernetes_asyncio.client import ApiException

from pko.machinery.resource import PODS, ResourceClient

from .runtime import Container, Obj, log, now

if TYPE_CHECKING:
    from .harness import PlayKubelet


class PodState:
    """One pod (one uid): its containers, sandbox and identity, and its status writes."""

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
            Container(c, True, dict(init_waiting), c.get("image", ""))
            for c in spec.get("initContainers") or []
        ]
        self.main = [
            Container(c, False, dict(main_waiting), c.get("image", "")) for c in spec.get("containers") or []
        ]

    @property
    def containers(self) -> list[Container]:
        return [*self.init, *self.main]

    def container(self, name: str) -> Container | None:
        return next((c for c in self.containers if c.name == name), None)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless the pod stops meanwhile; True when it is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    # -- status

    def _condition(self, type_: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        status = "True" if ok else "False"
        prev = self._cond_times.get(type_)
        when = prev[1] if prev and prev[0] == status else now()
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
                "lastTransitionTime": now(),
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
