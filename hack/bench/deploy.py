"""Deploying Stacks through the full path (issue 9): API writes per deployed Stack, and N Stacks from
apply to Ready beside a bare-loop floor.

The real operator runs as a process (``python -m pko``) under its ServiceAccount and the shipped RBAC;
kube-controller-manager's StatefulSet controller makes the pods; the play-kubelet
(test/controllers/kubelet.py) runs each workspace pod's real agent as a process with the stand-in
Pulumi CLI (test/fakepulumi, test-only). Every Stack is Program-sourced, so the agents fetch the
operator's own artifacts over loopback. The operator's writes are counted from the apiserver's audit
log (only requests made by its ServiceAccount), so the play-kubelet's and this script's writes never
count.

1. **Writes per deployed Stack**: one Program + Stack applied as ``kubectl apply`` would, until Ready.
2. **Throughput**: ``--stacks`` more at once, until all are Ready: wall time, operator CPU seconds
   per Stack, its peak RSS; beside it the floor, the same number of writes made by a bare
   kubernetes-asyncio loop (ConfigMap creates, ``--floor-concurrency`` at a time).

    .venv/bin/python hack/bench/deploy.py                # 100 Stacks
    .venv/bin/python hack/bench/deploy.py --stacks 3     # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from common import REPO, api_client

sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO / "test"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from controllers.kubelet import (
    AGENT_IMAGE,
    IMAGE_CONFIG,
    KNOWN_IMAGES,
    PlayKubelet,
    grant_auth_delegator,
)
from controllers.operator import OPERATOR_SERVICE_ACCOUNT, Operator
from localcluster import LocalCluster
from run import bounded, cpu_seconds, create_namespace, exit_on_sigterm, log, stop_and_keep_log
from steady import free_port, rss_mb

from pko.controllers.options import ControllerOptions
from pko.controllers.resources import PROGRAMS, STACKS
from pko.machinery.conditions import get_condition
from pko.machinery.resource import CONFIGMAPS, ResourceClient

NAMESPACE = "stacks"
OPERATOR_NAMESPACE = "pko-system"
KUBECTL = "kubectl"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
"""
PROGRAM_BODY: dict[str, Any] = {
    "resources": {
        "pw": {"type": "random:RandomPassword", "properties": {"length": 16}},
        "echo": {"type": "test:index:Echo", "properties": {"value": "hello"}},
    },
    "outputs": {"greeting": "${echo.value}", "password": "${pw.result}"},
}


class Audit:
    """The operator's writes, read from the apiserver's audit log (one JSON event per line)."""

    def __init__(self, path: Path, user: str) -> None:
        self.path = path
        self.user = user
        self.offset = 0

    def take(self) -> Counter[str]:
        """Writes since the last call, by ``verb resource[/subresource]`` (dry runs apart)."""
        counts: Counter[str] = Counter()
        if not self.path.exists():
            return counts
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
                continue
            if (event.get("user") or {}).get("username") != self.user:
                continue
            ref = event.get("objectRef") or {}
            what = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            dry = " (dry run)" if "dryRun=" in str(event.get("requestURI")) else ""
            counts[f"{event['verb']} {what}{dry}"] += 1
        return counts


def print_writes(counts: Counter[str], per: int) -> None:
    print("| verb resource | writes | per Stack |")
    print("|---|---:|---:|")
    for key, n in sorted(counts.items()):
        print(f"| {key} | {n} | {n / per:.1f} |")
    total = sum(counts.values())
    print(f"| **all** | **{total}** | **{total / per:.1f}** |")


async def apply_stack(api: Any, i: int) -> None:
    """A Program and a Stack that deploys it, server-side applied as ``kubectl apply`` does."""
    name = f"app-{i:04d}"
    program = {"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name}}
    program["program"] = PROGRAM_BODY
    stack = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": {"stack": f"dev-{i}", "programRef": {"name": name}},
    }
    await ResourceClient(api, PROGRAMS, NAMESPACE).apply(program, field_manager=KUBECTL)
    await ResourceClient(api, STACKS, NAMESPACE).apply(stack, field_manager=KUBECTL)


async def wait_ready(api: Any, names: list[str], within: float, sample: Any) -> None:
    stacks = ResourceClient(api, STACKS, NAMESPACE)
    deadline = time.monotonic() + within
    reported = time.monotonic()
    while True:
        listing = await stacks.list()
        ready = set()
        for obj in listing.items:
            cond = get_condition((obj.get("status") or {}).get("conditions"), "Ready")
            if cond and cond.get("status") == "True":
                ready.add(obj["metadata"]["name"])
        if ready >= set(names):
            return
        sample()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(set(names) - ready)} Stacks not Ready after {within:.0f}s")
        if time.monotonic() - reported > 30:
            reported = time.monotonic()
            log(f"{len(ready & set(names))}/{len(names)} Ready")
        await asyncio.sleep(1.0)


async def floor(api: Any, writes: int, concurrency: int) -> float:
    """Seconds a bare kubernetes-asyncio loop takes for ``writes`` ConfigMap creates."""
    await create_namespace(api, "floor")
    configmaps = ResourceClient(api, CONFIGMAPS, "floor")

    async def make(i: int) -> None:
        await configmaps.create({"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}})

    t0 = time.monotonic()
    await bounded(writes, concurrency, make)
    return time.monotonic() - t0


def operator_command(op: Operator, fs_port: int, metrics_port: int, health_port: int) -> list[str]:
    return [
        sys.executable, "-m", "pko", "--kubeconfig", str(op.kubeconfig), "--leader-elect=false",
        "--operator-namespace", OPERATOR_NAMESPACE,
        "--operator-service-account", OPERATOR_SERVICE_ACCOUNT,
        "--agent-image", AGENT_IMAGE, "--agent-image-pull-policy", "IfNotPresent",
        "--workspace-address-mode", "pod-ip",
        "--program-fs-addr", f"127.0.0.1:{fs_port}", "--program-fs-adv-addr", f"127.0.0.1:{fs_port}",
        "--metrics-bind-address", f"127.0.0.1:{metrics_port}",
        "--health-probe-bind-address", f"127.0.0.1:{health_port}",
    ]  # fmt: skip


async def caches_synced(health_port: int, proc: subprocess.Popen[bytes], within: float = 120.0) -> None:
    """Until the operator's /readyz says its caches have synced."""
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=5) as r:  # noqa: ASYNC210
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the operator did not become ready; see .bench-logs/deploy-operator.log")
        await asyncio.sleep(0.5)


async def bench(cluster: LocalCluster, audit_path: Path, tmp: Path, args: argparse.Namespace) -> None:
    api = await api_client(str(cluster.kubeconfig))
    async with api:
        subprocess.run(  # noqa: ASYNC221 - a one-off set-up step
            [KUBECTL, f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side", "-f",
             str(REPO / "config/crd/bases")],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        await create_namespace(api, NAMESPACE)
        await grant_auth_delegator(api, NAMESPACE, "default")
        options = ControllerOptions(
            operator_namespace=OPERATOR_NAMESPACE, operator_service_account=OPERATOR_SERVICE_ACCOUNT
        )
        op = Operator(api, cluster, options, rbac=True)
        (tmp / "operator").mkdir()
        await op.setup(tmp / "operator")
        kubelet = PlayKubelet(
            api, [NAMESPACE], root=tmp / "kubelet", server=cluster.server, ca_file=cluster.ca_file,
            images=KNOWN_IMAGES, image_config=IMAGE_CONFIG,
        )  # fmt: skip
        await kubelet.start()
        audit = Audit(audit_path, f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}")
        logf = open(tmp / "operator.log", "w")  # noqa: ASYNC230 - opened once, written by the child
        health_port = free_port()
        cmd = operator_command(op, free_port(), free_port(), health_port)
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        try:
            peak = [0.0]

            def sample() -> None:
                if proc.poll() is not None:
                    raise RuntimeError("the operator exited; see .bench-logs/deploy-operator.log")
                peak[0] = max(peak[0], rss_mb(proc.pid))

            log("one Program-sourced Stack, apply to Ready")
            await caches_synced(health_port, proc)
            audit.take()
            t0 = time.monotonic()
            await apply_stack(api, 0)
            await wait_ready(api, ["app-0000"], args.timeout, sample)
            one_wall = time.monotonic() - t0
            await asyncio.sleep(3)  # writes that trail Ready (events, the Update's cleanup)
            one = audit.take()

            n = args.stacks
            log(f"{n} Program-sourced Stacks at once, apply to Ready")
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            await bounded(n, 10, lambda i: apply_stack(api, i + 1))
            await wait_ready(api, [f"app-{i + 1:04d}" for i in range(n)], args.timeout, sample)
            wall, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
            await asyncio.sleep(3)
            many = audit.take()
            writes = sum(many.values())
            log(f"the floor: {writes} ConfigMap creates, {args.floor_concurrency} at a time")
            floor_s = await floor(api, writes, args.floor_concurrency)
        finally:
            stop_and_keep_log(proc, tmp / "operator.log", "deploy-operator.log")
            logf.close()
            await kubelet.stop()
            if op.api is not None:
                await op.api.close()  # the operator's identity, opened by setup()

    print("## Writes per deployed Stack\n")
    print(f"One Program and one Stack applied; the operator's API writes until the Stack was Ready "
          f"({one_wall:.1f} s), from the apiserver's audit log:\n")  # fmt: skip
    print_writes(one, 1)
    print(f"\n## {n} Stacks from apply to Ready\n")
    print("| figure | value |")
    print("|---|---:|")
    print(f"| wall time, apply to all Ready (s) | {wall:.1f} |")
    print(f"| the floor: {writes} writes by a bare loop (s) | {floor_s:.1f} |")
    print(f"| operator / floor | {wall / floor_s:.1f}x |" if floor_s else "| operator / floor | - |")
    print(f"| operator CPU seconds per Stack | {cpu / n:.2f} |")
    print(f"| operator RSS peak (MB) | {peak[0]:.0f} |")
    print(f"| operator writes per Stack | {writes / n:.1f} |")
    print("\nThe operator's writes for them:\n")
    print_writes(many, n)


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stacks", type=int, default=100)
    p.add_argument("--floor-concurrency", type=int, default=10)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for Ready")
    args = p.parse_args()
    print("# pko deploying Stacks (issue 9)\n")
    with tempfile.TemporaryDirectory(prefix="pko-deploy-") as name:
        tmp = Path(name)
        policy = tmp / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        audit_path = tmp / "audit.log"
        extra = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_path}", "--audit-log-format=json"]
        cluster = LocalCluster(tmp / "cluster", extra_apiserver_args=extra)
        log("starting a control plane (with kube-controller-manager)")
        cluster.start()
        try:
            asyncio.run(bench(cluster, audit_path, tmp, args))
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
