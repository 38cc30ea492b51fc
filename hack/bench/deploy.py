"""Deploying Stacks through the full path on the real Pulumi engine: API writes per deployed Stack, the
operator's own overhead per update beside the time `pulumi up` itself takes, agent start to serving,
and N Stacks from apply to Ready beside a bare-loop floor.

The real operator runs as a process (``python -m pko``) under its ServiceAccount and the shipped RBAC;
kube-controller-manager's StatefulSet controller makes the pods; the play-kubelet
(pko/devtools/playkubelet/) runs each workspace pod's real agent as a process with the real Pulumi
engine (hack/build-pulumi.sh: the CLI, the YAML host and pulumi-kubernetes). Every Stack is
Program-sourced (a ConfigMap made by pulumi-kubernetes, and a secret output), so the agents fetch the
operator's own artifacts over loopback. The operator's writes are counted from the apiserver's audit
log (only requests made by its ServiceAccount), so the play-kubelet's, the programs' and this script's
writes never count; so are its reads of Secrets (get, list, watch: it GETs each one it needs by name
and caches none, so list and watch must stay 0).

1. **Agent start to serving**: ``python -m pko.agent serve`` on a YAML project with the real CLI, until
   its first RPC answers, beside `pulumi version` alone (which opening the workspace runs).
2. **Writes per deployed Stack** and **overhead per update**: one Program + Stack applied as
   ``kubectl apply`` would, until Ready; beside it the `pulumi up` duration the engine reported.
3. **Throughput**: ``--stacks`` more at once, until all are Ready: wall time, operator CPU seconds
   per Stack, its peak RSS; beside it the floor, the same number of writes made by a bare
   kubernetes-asyncio loop (ConfigMap creates, ``--floor-concurrency`` at a time).

    .venv/bin/python hack/bench/deploy.py                # 100 Stacks
    .venv/bin/python hack/bench/deploy.py --stacks 3     # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from common import REPO, api_client
from driver import (
    bounded,
    cpu_seconds,
    create_namespace,
    exit_on_sigterm,
    free_port,
    log,
    rss_mb,
    stop_and_keep_log,
)
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from kubernetes_asyncio import client
from pko.api.generated.pko.agent import v1 as pb

from pko.controllers.options import ControllerOptions
from pko.controllers.resources import PROGRAMS, STACKS, UPDATES
from pko.devtools.benchrecord import recording
from pko.devtools.localcluster import LocalCluster
from pko.devtools.operatorharness import OPERATOR_SERVICE_ACCOUNT, Operator
from pko.devtools.playkubelet import (
    AGENT_IMAGE,
    IMAGE_CONFIG,
    KNOWN_IMAGES,
    PlayKubelet,
    grant_auth_delegator,
)
from pko.devtools.realpulumi import make_real_pulumi
from pko.machinery.conditions import get_condition
from pko.machinery.resource import CONFIGMAPS, ResourceClient

NAMESPACE = "stacks"
OPERATOR_NAMESPACE = "pko-system"
KUBECTL = "kubectl"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
SECRET_READ_VERBS = ("get", "list", "watch")
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
# Metadata only, the operator's requests only: its writes, and its reads of Secrets.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}"]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: Metadata
  users: ["{OPERATOR_USER}"]
  verbs: ["get", "list", "watch"]
  resources: [{{group: "", resources: ["secrets"]}}]
- level: None
"""
PROGRAM_BODY: dict[str, Any] = {
    "resources": {
        "settings": {
            "type": "kubernetes:core/v1:ConfigMap",
            "properties": {"metadata": {"namespace": NAMESPACE}, "data": {"greeting": "hello"}},
        },
    },
    "outputs": {"greeting": "${settings.data.greeting}", "uid": {"fn::secret": "${settings.metadata.uid}"}},
}
PROGRAMS_ROLE: dict[str, Any] = {
    "metadata": {"name": "programs"},
    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
}


async def start_harness(
    api: Any, cluster: LocalCluster, tmp: Path, engine: Any, *, programs_role: bool = True
) -> tuple[Operator, PlayKubelet]:
    """The bench's namespace (its ``default`` account may create TokenReviews, and with
    ``programs_role`` the programs' ConfigMaps), the operator's ServiceAccount and RBAC
    (:class:`Operator`'s set-up in ``tmp/operator``) and a started play-kubelet running ``engine``."""
    await create_namespace(api, NAMESPACE)
    await grant_auth_delegator(api, NAMESPACE, "default")
    if programs_role:
        await grant_programs_role(api)
    options = ControllerOptions(
        operator_namespace=OPERATOR_NAMESPACE, operator_service_account=OPERATOR_SERVICE_ACCOUNT
    )
    op = Operator(api, cluster, options, rbac=True)
    (tmp / "operator").mkdir()
    await op.setup(tmp / "operator")
    kubelet = PlayKubelet(
        api, [NAMESPACE], root=tmp / "kubelet", server=cluster.server, ca_file=cluster.ca_file,
        images=KNOWN_IMAGES, image_config=IMAGE_CONFIG, engine=engine,
    )  # fmt: skip
    await kubelet.start()
    return op, kubelet


async def grant_programs_role(api: Any) -> None:
    """:data:`PROGRAMS_ROLE` bound to the namespace's ``default`` ServiceAccount: pulumi-kubernetes
    makes the programs' ConfigMaps as the workspace pod's account."""
    rbac = client.RbacAuthorizationV1Api(api)
    await rbac.create_namespaced_role(NAMESPACE, PROGRAMS_ROLE)
    await rbac.create_namespaced_role_binding(
        NAMESPACE,
        {
            "metadata": {"name": "programs"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "programs"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NAMESPACE}],
        },
    )


class Audit:
    """The operator's writes and Secret reads, read from the apiserver's audit log (one JSON event per
    line)."""

    def __init__(self, path: Path, user: str) -> None:
        self.path = path
        self.user = user
        self.offset = 0
        self.seen: set[str] = set()  # audit IDs of the reads counted

    def take(self) -> tuple[Counter[str], dict[str, int]]:
        """Writes since the last call, by ``verb resource[/subresource]`` (dry runs apart), and Secret
        reads by verb (each request once: a watch logs ResponseStarted, and ResponseComplete when it ends)."""
        counts: Counter[str] = Counter()
        reads = dict.fromkeys(SECRET_READ_VERBS, 0)
        if not self.path.exists():
            return counts, reads
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != self.user:
                continue
            if event.get("verb") in reads and (event.get("objectRef") or {}).get("resource") == "secrets":
                if event.get("auditID") not in self.seen:
                    self.seen.add(event.get("auditID"))
                    reads[event["verb"]] += 1
                continue
            if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
                continue
            ref = event.get("objectRef") or {}
            what = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            dry = " (dry run)" if "dryRun=" in str(event.get("requestURI")) else ""
            counts[f"{event['verb']} {what}{dry}"] += 1
        return counts, reads


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


async def pulumi_seconds(api: Any, stacks: list[str]) -> list[float]:
    """How long `pulumi up` took in each Stack's last Update, as the engine reported (start -> end)."""
    out: list[float] = []
    for name in stacks:
        stack = await ResourceClient(api, STACKS, NAMESPACE).get(name)
        last = ((stack.get("status") or {}).get("lastUpdate") or {}).get("name")
        update = await ResourceClient(api, UPDATES, NAMESPACE).get(last) if last else {}
        status = update.get("status") or {}
        if status.get("startTime") and status.get("endTime"):
            start = datetime.fromisoformat(status["startTime"].replace("Z", "+00:00"))
            end = datetime.fromisoformat(status["endTime"].replace("Z", "+00:00"))
            out.append((end - start).total_seconds())
    return out


async def agent_serving(tmp: Path, runs: int) -> tuple[list[float], list[float]]:
    """Seconds from starting an agent process to its first answered RPC, and `pulumi version` alone."""
    real = make_real_pulumi(tmp / "serving")
    work = tmp / "serving" / "workspace"
    work.mkdir(parents=True, exist_ok=True)
    (work / "Pulumi.yaml").write_text("name: serving\nruntime: yaml\noutputs:\n  a: b\n")
    env = {**os.environ, **real.env}
    serving, versions = [], []
    for i in range(runs):
        t0 = time.monotonic()
        subprocess.run([str(real.command), "version"], env=env, check=True, capture_output=True)  # noqa: ASYNC221
        versions.append(time.monotonic() - t0)
        port = free_port()
        cmd = [
            sys.executable, "-m", "pko.agent", "--", "serve", "--workspace", str(work), "--skip-install",
            "--host", "127.0.0.1", "--port", str(port), "--pulumi-root", str(real.root),
            "--journal-dir", str(tmp / "serving" / f"journal-{i}"),
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        try:
            while True:
                channel = Channel("127.0.0.1", port)
                try:
                    await pb.AutomationServiceStub(channel).pulumi_version(timeout=5)
                    serving.append(time.monotonic() - t0)
                    break
                except (OSError, TimeoutError, GRPCError):
                    if proc.poll() is not None or time.monotonic() - t0 > 60:
                        raise RuntimeError("the agent did not start serving") from None
                    await asyncio.sleep(0.01)
                finally:
                    channel.close()
        finally:
            proc.terminate()
            proc.wait()
    return serving, versions


async def bench(
    cluster: LocalCluster, audit_path: Path, tmp: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Every figure of the run, as the tables print them and the JSON records them."""
    log("agent start to serving, with the real CLI")
    serving, versions = await agent_serving(tmp, args.agent_runs)
    api = await api_client(str(cluster.kubeconfig))
    async with api:
        subprocess.run(  # noqa: ASYNC221 - a one-off set-up step
            [KUBECTL, f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side", "-f",
             str(REPO / "config/crd/bases")],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        op, kubelet = await start_harness(api, cluster, tmp, make_real_pulumi)
        audit = Audit(audit_path, OPERATOR_USER)
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
            startup_reads = audit.take()[1]
            t0 = time.monotonic()
            await apply_stack(api, 0)
            await wait_ready(api, ["app-0000"], args.timeout, sample)
            one_wall = time.monotonic() - t0
            await asyncio.sleep(3)  # writes that trail Ready (events, the Update's cleanup)
            one, one_reads = audit.take()
            one_pulumi = await pulumi_seconds(api, ["app-0000"])

            n = args.stacks
            log(f"{n} Program-sourced Stacks at once, apply to Ready")
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            await bounded(n, 10, lambda i: apply_stack(api, i + 1))
            await wait_ready(api, [f"app-{i + 1:04d}" for i in range(n)], args.timeout, sample)
            wall, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
            await asyncio.sleep(3)
            many, many_reads = audit.take()
            many_pulumi = await pulumi_seconds(api, [f"app-{i + 1:04d}" for i in range(n)])
            writes = sum(many.values())
            log(f"the floor: {writes} ConfigMap creates, {args.floor_concurrency} at a time")
            floor_s = await floor(api, writes, args.floor_concurrency)
        finally:
            stop_and_keep_log(proc, tmp / "operator.log", "deploy-operator.log")
            logf.close()
            await kubelet.stop()
            if op.api is not None:
                await op.api.close()  # the operator's identity, opened by setup()

    return {
        "startup_secret_reads": startup_reads,
        "agent": {"serving_s": serving, "pulumi_version_s": versions},
        "one_stack": {
            "apply_to_ready_s": one_wall,
            "pulumi_up_s": one_pulumi[0] if one_pulumi else None,
            "writes": dict(one),
            "secret_reads": one_reads,
        },
        "many_stacks": {
            "stacks": n,
            "apply_to_ready_s": wall,
            "operator_cpu_s": cpu,
            "operator_rss_peak_mb": peak[0],
            "writes": dict(many),
            "secret_reads": many_reads,
            "pulumi_up_s": many_pulumi,
            "floor_writes": writes,
            "floor_concurrency": args.floor_concurrency,
            "floor_s": floor_s,
        },
    }


def print_writes(counts: dict[str, int], per: int) -> None:
    print("| verb resource | writes | per Stack |")
    print("|---|---:|---:|")
    for key, n in sorted(counts.items()):
        print(f"| {key} | {n} | {n / per:.1f} |")
    total = sum(counts.values())
    print(f"| **all** | **{total}** | **{total / per:.1f}** |")


def print_tables(figures: dict[str, Any]) -> None:
    """The run's tables, from the figures bench() measured (the same dict the JSON records)."""
    agent, one, many = figures["agent"], figures["one_stack"], figures["many_stacks"]
    serving, versions = agent["serving_s"], agent["pulumi_version_s"]
    print("## Agent start to serving\n")
    print("| figure | median s | runs |")
    print("|---|---:|---:|")
    print(f"| agent process start -> first RPC answered (goal 0.5 s) | {statistics.median(serving):.2f} | "
          f"{len(serving)} |")  # fmt: skip
    print(f"| of which `pulumi version` (opening the workspace runs it) | "
          f"{statistics.median(versions):.2f} | {len(versions)} |\n")  # fmt: skip
    one_wall, one_up = one["apply_to_ready_s"], one["pulumi_up_s"]
    print("## One Stack: the operator's overhead per update\n")
    print("| figure | s |")
    print("|---|---:|")
    print(f"| Program + Stack applied -> Stack Ready | {one_wall:.1f} |")
    if one_up:
        print(f"| of which `pulumi up` in the workspace (the engine's own start -> end) | {one_up:.1f} |")
        print(f"| the rest: workspace pod, agent, program fetch, stack select, config, status writes | "
              f"{one_wall - one_up:.1f} ({one_wall / one_up:.1f}x the up) |")  # fmt: skip
    print("\n## Writes per deployed Stack\n")
    print(f"One Program and one Stack applied; the operator's API writes until the Stack was Ready "
          f"({one_wall:.1f} s), from the apiserver's audit log:\n")  # fmt: skip
    print_writes(one["writes"], 1)
    n, wall, floor_s = many["stacks"], many["apply_to_ready_s"], many["floor_s"]
    writes = sum(many["writes"].values())
    print(f"\n## {n} Stacks from apply to Ready\n")
    print("| figure | value |")
    print("|---|---:|")
    print(f"| wall time, apply to all Ready (s) | {wall:.1f} |")
    print(f"| the floor: {many['floor_writes']} writes by a bare loop (s) | {floor_s:.1f} |")
    print(f"| operator / floor | {wall / floor_s:.1f}x |" if floor_s else "| operator / floor | - |")
    print(f"| operator CPU seconds per Stack | {many['operator_cpu_s'] / n:.2f} |")
    print(f"| operator RSS peak (MB) | {many['operator_rss_peak_mb']:.0f} |")
    print(f"| operator writes per Stack | {writes / n:.1f} |")
    if many["pulumi_up_s"]:
        print(f"| `pulumi up` per Stack, median (s) | {statistics.median(many['pulumi_up_s']):.1f} |")
    print(f"\n## The operator's writes for the {n} Stacks\n")
    print_writes(many["writes"], n)
    print("\n## The operator's Secret reads\n")
    print("Requests on `secrets` by the operator's ServiceAccount, from the audit log: it GETs each Secret "
          "it needs by name and never lists or watches them.\n")  # fmt: skip
    print(f"| verb resource | start to caches synced | one Stack | {n} Stacks | per Stack (of the {n}) |")
    print("|---|---:|---:|---:|---:|")
    for verb in SECRET_READ_VERBS:
        print(f"| {verb} secrets | {figures['startup_secret_reads'][verb]} | {one['secret_reads'][verb]} | "
              f"{many['secret_reads'][verb]} | {many['secret_reads'][verb] / n:.1f} |")  # fmt: skip


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stacks", type=int, default=100)
    p.add_argument("--floor-concurrency", type=int, default=10)
    p.add_argument("--agent-runs", type=int, default=5, help="agent start-to-serving runs")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for Ready")
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = p.parse_args()
    with recording("hack/bench/deploy.py", args.json, vars(args)) as run:
        run.figures.update(measure(args))
        print("# pko deploying Stacks on the real Pulumi engine\n")
        print_tables(run.figures)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
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
            return asyncio.run(bench(cluster, audit_path, tmp, args))
        finally:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
