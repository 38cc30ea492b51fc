"""peerscale.py's view of the operator: its pod (the one running, its cgroups and processes on this
host: CPU, throttling, RSS, restarts), when it holds the leader Lease, and its Deployment's scale."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import procstats
from driver import log
from peer import OPERATOR_NS, get, kubectl

from pko.devtools.waiting import wait_until

Obj = dict[str, Any]
SELECTOR = "control-plane=controller-manager"
DEPLOYMENT = "deployment/controller-manager"
LEASE = "operator.pulumi.com"  # both operators' leader election ID
MIB = 1024 * 1024


# --- the operator's pod --------------------------------------------------------------------------


def running(pods: list[Obj]) -> Obj | None:
    """The one pod not being deleted whose containers all run (None while there is none, or more
    than one: a rollout in progress)."""
    live = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("containerStatuses")
        and all("running" in (c.get("state") or {}) for c in p["status"]["containerStatuses"])
    ]
    return live[0] if len(live) == 1 else None


def restarts(pod: Obj) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


@dataclass(frozen=True)
class OperatorPod:
    """The operator's pod as this host sees it: its cgroup directories and processes."""

    name: str
    uid: str
    cpuacct: Path
    cpu: Path | None  # cpu.stat (throttling); absent on a host without the cpu controller
    memory: Path

    @classmethod
    def of(cls, pod: Obj) -> OperatorPod | None:
        uid = pod["metadata"]["uid"]
        cpuacct = procstats.pod_cgroup("cpuacct", uid) or procstats.pod_cgroup("cpu,cpuacct", uid)
        memory = procstats.pod_cgroup("memory", uid)
        if cpuacct is None or memory is None:
            return None
        cpu = procstats.pod_cgroup("cpu", uid) or procstats.pod_cgroup("cpu,cpuacct", uid)
        return cls(pod["metadata"]["name"], uid, cpuacct, cpu, memory)

    def cpu_seconds(self) -> float:
        try:
            return procstats.cpuacct_seconds(self.cpuacct)
        except OSError as exc:
            raise RuntimeError(f"the operator pod {self.name} is gone from this host ({exc})") from exc

    def throttled_seconds(self) -> float:
        try:
            return procstats.throttled_seconds(self.cpu) if self.cpu is not None else 0.0
        except OSError:
            return 0.0

    def rss_bytes(self) -> int:
        """The pod's processes' VmRSS summed (the sandbox's ``pause`` left out)."""
        pids = procstats.cgroup_pids(self.memory)
        if not pids:
            raise RuntimeError(f"no process in {self.memory}")
        return 1024 * sum(procstats.process_kb(pids, "VmRSS").values())

    def hwm_bytes(self) -> int:
        """The largest process's VmHWM (its own peak since it started: a spike between samples)."""
        return 1024 * max(
            procstats.process_kb(procstats.cgroup_pids(self.memory), "VmHWM").values(), default=0
        )

    def restarts(self) -> int:
        pod = get("pod", self.name, OPERATOR_NS)
        return restarts(pod) if pod is not None else -1


def operator_pods(run: Callable[..., str] = kubectl) -> list[Obj]:
    listed = json.loads(run("-n", OPERATOR_NS, "get", "pods", "-l", SELECTOR, "-o", "json"))
    items: list[Obj] = listed["items"]
    return items


async def poll(what: str, check: Callable[[], Any], within: float, every: float = 1.0) -> Any:
    """``check()`` (blocking: run in a thread) until it returns something true; TimeoutError after
    ``within`` seconds. peer.wait polls every 50 ms, too often for waits of minutes."""
    return await wait_until(what, lambda: asyncio.to_thread(check), within=within, interval=every)


async def started_pod(run: Callable[..., str] = kubectl, within: float = 300) -> OperatorPod:
    """The operator's pod once it runs and its cgroups are on this host."""

    def found() -> OperatorPod | None:
        pod = running(operator_pods(run))
        return OperatorPod.of(pod) if pod is not None else None

    found_pod: OperatorPod = await poll("the operator pod running", found, within, every=0.25)
    return found_pod


async def leader_at(pod: OperatorPod, run: Callable[..., str] = kubectl, within: float = 180) -> float | None:
    """When ``pod`` was first seen holding the leader Lease (None: not within ``within`` s)."""

    def holds() -> bool:
        out = run("-n", OPERATOR_NS, "get", "lease", LEASE, "-o", "json", check=False)
        holder = str(((json.loads(out) if out else {}).get("spec") or {}).get("holderIdentity") or "")
        return holder.startswith(f"{pod.name}_")  # both: "<pod name>_<uuid>"

    try:
        await poll(f"{pod.name} to hold the Lease {LEASE}", holds, within, every=0.25)
    except (RuntimeError, TimeoutError) as exc:  # a kubectl that failed, or not within the time
        log(f"  {exc}")
        return None
    return time.time()


def scale(replicas: int, run: Callable[..., str] = kubectl) -> None:
    run("-n", OPERATOR_NS, "scale", DEPLOYMENT, f"--replicas={replicas}")
