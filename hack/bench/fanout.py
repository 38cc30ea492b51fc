"""The fan-out benchmark (run.py's table 2): N FanOut objects, one contender process writing every
status, timed by a watch in the driver from the contender's ``START`` line until the last status is seen."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import GROUP, KIND, PLURAL, REPO, VERSION, WORKERS
from driver import CREATE_CONCURRENCY, bounded, cpu_seconds, create_namespace, log
from prometheus_client.parser import text_string_to_metric_families

from pko.devtools.localcluster import LocalCluster
from pko.machinery.resource import Resource, ResourceClient

HERE = Path(__file__).resolve().parent
BENCH_VENV = REPO / ".venv-bench"
FANOUTS = Resource(GROUP, VERSION, PLURAL, KIND)
CONTENDER_LABELS = {
    "bare": "bare kubernetes-asyncio loop (anchor)",
    "bare-pko": "bare loop on pko's ApiClient",
    "ours": "pko machinery (Manager, 25 workers)",
    "kopf": "kopf, one-line handler",
}


def ensure_bench_venv() -> str:
    """kopf lives in .venv-bench only (never a project dependency); created on first use."""
    python = BENCH_VENV / "bin/python"
    if not python.exists():
        log("creating .venv-bench with kopf")
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "kopf>=1.37"], check=True)
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('kopf'))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


async def create_fanouts(api: Any, namespace: str, n: int) -> None:
    objects = ResourceClient(api, FANOUTS, namespace)

    async def make(i: int) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": f"fo-{i:05d}"},
            "spec": {"value": i},
        }
        await objects.create(body)

    await bounded(n, CREATE_CONCURRENCY, make)


async def patch_requests(api: Any, resource: str) -> float:
    """PATCH requests the apiserver has served for ``resource`` (any subresource) so far."""
    resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False)
    text = (await resp.read()).decode()
    resp.release()
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for s in family.samples:
            labels = s.labels
            if (
                s.name.endswith("_total")
                and labels.get("verb") == "PATCH"
                and labels.get("resource") == resource
            ):
                total += s.value
    return total


# --- fan-out -------------------------------------------------------------------------------------


@dataclass
class FanoutResult:
    size: int
    contender: str
    start_to_done: float
    spawn_to_done: float
    contender_cpu: float
    apiserver_cpu: float
    etcd_cpu: float
    patches: float
    observed: int


@dataclass
class Observer:
    """Watches the namespace's FanOuts and notes when every one has ``status.observed``."""

    api: Any
    namespace: str
    expected: int
    done_at: float = 0.0
    seen: set[str] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, ready: asyncio.Event) -> None:
        client = ResourceClient(self.api, FANOUTS, self.namespace)
        listed = await client.list()
        for obj in listed.items:
            self._see(obj)
        rv = listed.resource_version
        ready.set()
        while not self.done.is_set():
            async with client.watch(resource_version=rv, timeout_seconds=600) as events:
                async for event in events:
                    if event.type == "BOOKMARK":
                        rv = event.object["metadata"]["resourceVersion"]
                        continue
                    rv = event.object["metadata"]["resourceVersion"]
                    self._see(event.object)
                    if self.done.is_set():
                        return

    def _see(self, obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("observed"):
            self.seen.add(obj["metadata"]["name"])
            if len(self.seen) >= self.expected and not self.done.is_set():
                self.done_at = time.time()
                self.done.set()


def contender_command(contender: str, kubeconfig: str, namespace: str) -> list[str]:
    if contender == "kopf":
        return [str(BENCH_VENV / "bin/python"), str(HERE / "fanout_kopf.py"), kubeconfig, namespace]
    if contender == "bare-pko":
        return [
            sys.executable,
            str(HERE / "fanout_bare.py"),
            kubeconfig,
            namespace,
            str(WORKERS),
            "pko-client",
        ]
    return [sys.executable, str(HERE / f"fanout_{contender}.py"), kubeconfig, namespace, str(WORKERS)]


async def run_fanout(
    api: Any, cluster: LocalCluster, contender: str, size: int, run_id: str, logs: Path, limit: float
) -> FanoutResult:
    namespace = f"fanout-{contender}-{size}-{run_id}"
    await create_namespace(api, namespace)
    log(f"fan-out {contender} N={size}: creating objects in {namespace}")
    await create_fanouts(api, namespace, size)
    await asyncio.sleep(1.0)  # let the apiserver settle after the burst of creates

    observer = Observer(api, namespace, size)
    ready = asyncio.Event()
    watching = asyncio.create_task(observer.run(ready))
    await ready.wait()
    pids = cluster.state.pids if cluster.state else {}
    api_cpu0, etcd_cpu0 = cpu_seconds(pids["kube-apiserver"]), cpu_seconds(pids["etcd"])
    patches0 = await patch_requests(api, PLURAL)
    log_file = (logs / f"{namespace}.log").open("wb")
    spawned = time.time()
    proc = await asyncio.create_subprocess_exec(
        *contender_command(contender, str(cluster.kubeconfig), namespace),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=log_file,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        if not line.startswith("START "):
            raise RuntimeError(f"{contender} did not start: {line!r}; see {log_file.name}")
        started = float(line.split()[1])
        drain = asyncio.create_task(proc.stdout.read())
        waiter = asyncio.create_task(observer.done.wait())
        exited = asyncio.create_task(proc.wait())
        await asyncio.wait({waiter, exited}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        if not observer.done.is_set():
            # The bare loop exits when its last PATCH returned; the watch event may still be in flight.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(observer.done.wait(), 30)
        contender_cpu = cpu_seconds(proc.pid)
        api_cpu = cpu_seconds(pids["kube-apiserver"]) - api_cpu0
        etcd_cpu = cpu_seconds(pids["etcd"]) - etcd_cpu0
        if not observer.done.is_set():
            raise RuntimeError(f"{contender}: only {len(observer.seen)}/{size} statuses; see {log_file.name}")
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        waiter.cancel()
        watching.cancel()
        with contextlib.suppress(BaseException):
            await watching
        log_file.close()
    tail = (await drain).decode()
    if contender_cpu == 0.0:  # it had exited (the bare loop): it reports its own CPU
        contender_cpu = next((float(x.split()[1]) for x in tail.splitlines() if x.startswith("CPU ")), -1.0)
    patches = await patch_requests(api, PLURAL) - patches0
    await api.call_api(
        f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
        "DELETE",
        auth_settings=["BearerToken"],
        _preload_content=True,
    )
    return FanoutResult(
        size,
        contender,
        observer.done_at - started,
        observer.done_at - spawned,
        contender_cpu,
        api_cpu,
        etcd_cpu,
        patches,
        len(observer.seen),
    )
