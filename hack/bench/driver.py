"""What the benchmark drivers share (run.py, deploy.py, steady.py and the node benches): their log line,
SIGTERM handling, a process's CPU and memory, a free port, and setting up the control plane they start."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import FANOUT_CRD, GROUP, PLURAL, REPO, STACK_GROUP, STACK_PLURAL

from pko.devtools.localcluster import LocalCluster
from pko.machinery.resource import NAMESPACES, Resource, ResourceClient

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
TICKS = os.sysconf("SC_CLK_TCK")
CREATE_CONCURRENCY = 50  # objects a bench creates at once


def exit_on_sigterm() -> None:
    """SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C, so `finally` stops the control plane."""

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)


def stop_and_keep_log(proc: subprocess.Popen[bytes] | None, log_path: Path, kept_as: str) -> None:
    """Stop a benchmarked process (SIGTERM, SIGKILL after 30 s) and keep its log as
    ``.bench-logs/<kept_as>`` for a look after the run."""
    if proc is not None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if log_path.exists():
        kept = REPO / ".bench-logs"
        kept.mkdir(exist_ok=True)
        (kept / kept_as).write_bytes(log_path.read_bytes())


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


# --- cluster set-up ------------------------------------------------------------------------------


async def wait_established(api: Any, name: str) -> None:
    crds = ResourceClient(api, CRDS)
    for _ in range(600):
        crd = await crds.get(name)
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"CRD {name} not established")


async def install_crds(api: Any, cluster: LocalCluster) -> None:
    await ResourceClient(api, CRDS).create(FANOUT_CRD)
    kubectl = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--kubeconfig={cluster.kubeconfig}",
        "apply",
        "--server-side",
        "-f",
        str(REPO / "config/crd/bases/pulumi.com_stacks.yaml"),
        stdout=asyncio.subprocess.DEVNULL,
    )
    if await kubectl.wait() != 0:
        raise RuntimeError("kubectl apply of the Stack CRD failed")
    await wait_established(api, f"{PLURAL}.{GROUP}")
    await wait_established(api, f"{STACK_PLURAL}.{STACK_GROUP}")


async def create_namespace(api: Any, name: str) -> None:
    await ResourceClient(api, NAMESPACES).create({"metadata": {"name": name}})


async def bounded(n: int, concurrency: int, make: Any) -> None:
    """Run ``make(i)`` for i in range(n), ``concurrency`` at a time."""
    items = iter(range(n))

    async def worker() -> None:
        for i in items:
            await make(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
