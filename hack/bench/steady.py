"""Steady state at scale (issue 9): N Ready Stacks seeded into the API, the real operator
(``python -m pko``) started against them, then sampled for a window: RSS, CPU % of one core, and
when reconciles fire (controller_runtime_reconcile_total deltas per bucket: spread, not bunched).

One command, its own control plane (hack/localcluster.py):

    .venv/bin/python hack/bench/steady.py --stacks 10000 --duration 300
    .venv/bin/python hack/bench/steady.py --stacks 50 --duration 10      # smoke

Limitation (this slice): only the Stacks are seeded (spec + a Ready status as the operator writes
it); their Workspaces, StatefulSets, Services and Updates are not, so the first minutes include the
operator creating those. The figures say so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import REPO, api_client, stack_spec

sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcluster import LocalCluster
from prometheus_client.parser import text_string_to_metric_families
from run import apply_stacks, cpu_seconds, create_namespace, install_crds, log

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reconciles(port: int) -> dict[str, float]:
    """controller_runtime_reconcile_total summed per controller."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "controller_runtime_reconcile":
            continue
        for s in fam.samples:
            if s.name.endswith("_total"):
                c = s.labels.get("controller", "?")
                out[c] = out.get(c, 0.0) + s.value
    return out


def informers(log_path: Path) -> list[tuple[str, str]]:
    """(resource, namespace) of every informer the operator's log says it synced."""
    seen: list[tuple[str, str]] = []
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == "synced" and "resource" in rec:
            key = (str(rec["resource"]), str(rec.get("namespace", "")))
            if key not in seen:
                seen.append(key)
    return seen


WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY"}


async def _writes(kubeconfig: str) -> dict[tuple[str, str], float]:
    api = await api_client(kubeconfig)
    async with api:
        resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False)
        text = (await resp.read()).decode()
        resp.release()
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "apiserver_request":
            continue
        for s in fam.samples:
            verb = s.labels.get("verb", "")
            if s.name.endswith("_total") and verb in WRITE_VERBS:
                sub = s.labels.get("subresource", "")
                key = (verb, s.labels.get("resource", "") + (f"/{sub}" if sub else ""))
                out[key] = out.get(key, 0.0) + s.value
    return out


def api_writes(cluster: LocalCluster) -> dict[tuple[str, str], float]:
    """Write requests the apiserver has served so far, by (verb, resource[/subresource])."""
    return asyncio.run(_writes(str(cluster.kubeconfig)))


def pinned_stack_spec(i: int) -> dict[str, Any]:
    """The benchmark's Stack, pinned to the commit its seeded status records: no branch to poll, so
    the operator never looks up a remote (benchmarks talk only to loopback) and has nothing to run."""
    body = stack_spec(i)
    body["spec"].pop("branch", None)
    body["spec"]["commit"] = f"{i * 2654435761 % 2**160:040x}"  # common.stack_status's commit
    return body


async def seed(cluster: LocalCluster, n: int) -> None:
    api = await api_client(str(cluster.kubeconfig))
    async with api:
        await install_crds(api, cluster)
        # every pko CRD (install_crds applies only the Stack's): without them the operator never syncs
        subprocess.run(  # noqa: ASYNC221 - a one-off set-up step
            ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side", "-f",
             str(REPO / "config/crd/bases")],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        await asyncio.sleep(3)  # let the CRDs become established
        await create_namespace(api, "stacks")
        log(f"seeding {n} Ready Stacks")
        await apply_stacks(api, "stacks", n, spec=pinned_stack_spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stacks", type=int, default=10000)
    p.add_argument("--duration", type=float, default=300.0, help="window in seconds (default %(default)s)")
    p.add_argument("--buckets", type=int, default=10, help="histogram buckets over the window")
    p.add_argument("--settle", type=float, default=30.0, help="seconds after start before the window")
    args = p.parse_args()
    print("# pko steady state at scale (issue 9)\n")
    with tempfile.TemporaryDirectory(prefix="pko-steady-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", with_controller_manager=False)
        log("starting a control plane")
        cluster.start()
        proc = None
        try:
            asyncio.run(seed(cluster, args.stacks))
            mport = free_port()
            cmd = [
                sys.executable, "-m", "pko", "--kubeconfig", str(cluster.kubeconfig),
                "--metrics-bind-address", f"127.0.0.1:{mport}",
                "--health-probe-bind-address", f"127.0.0.1:{free_port()}",
                "--program-fs-addr", f"127.0.0.1:{free_port()}",
                "--leader-elect=false",
            ]  # fmt: skip
            logf = open(Path(tmp) / "operator.log", "w")
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 120
            while True:
                try:
                    reconciles(mport)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        print((Path(tmp) / "operator.log").read_text()[-3000:])
                        raise RuntimeError("operator did not serve metrics") from None
                    time.sleep(0.5)
            log(f"operator up; settling {args.settle}s")
            time.sleep(args.settle)
            step = args.duration / args.buckets
            w0 = api_writes(cluster)
            cpu0, t0, r0 = cpu_seconds(proc.pid), time.monotonic(), reconciles(mport)
            prev = r0
            hist: list[float] = []
            peak = rss_mb(proc.pid)
            for _ in range(args.buckets):
                time.sleep(step)
                now = reconciles(mport)
                hist.append(sum(now.values()) - sum(prev.values()))
                prev = now
                peak = max(peak, rss_mb(proc.pid))
            cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
            rss = rss_mb(proc.pid)
            w1 = api_writes(cluster)
            cpu_pct = 100 * (cpu1 - cpu0) / (t1 - t0)
            print(
                f"Stacks seeded: {args.stacks} (Stacks only; see limitation), window {args.duration:.0f} s\n"
            )
            print("| figure | value | target |")
            print("|---|---:|---|")
            print(f"| operator RSS at end (MB) | {rss:.0f} | <= 400 |")
            print(f"| operator RSS peak in window (MB) | {peak:.0f} | <= 400 |")
            print(f"| operator CPU % of one core over window | {cpu_pct:.1f} | <= 5 |")
            per = {c: prev.get(c, 0) - r0.get(c, 0) for c in prev}
            print(f"\nreconciles before the window (start-up + settle): {r0}")
            print(f"\nreconciles per controller in window: {per}\n")
            print("| bucket start s | reconciles |")
            print("|---:|---:|")
            for i, h in enumerate(hist):
                print(f"| {i * step:.0f} | {h:.0f} |")
            print(
                "\nAPI writes served in the window (only the operator writes then), by verb and resource:\n"
            )
            print("| verb | resource | writes |")
            print("|---|---|---:|")
            for key in sorted(w1):
                d = w1[key] - w0.get(key, 0.0)
                if d:
                    print(f"| {key[0]} | {key[1]} | {d:.0f} |")
            print(f"| all | all | {sum(w1.values()) - sum(w0.values()):.0f} |")
            cached = informers(Path(tmp) / "operator.log")
            print(f"\ninformers synced (resource, namespace): {cached}")
            leaked = [r for r, _ in cached if r in ("secrets", "configmaps")]
            print(f"Secrets/ConfigMaps cached: {'yes: ' + ', '.join(leaked) if leaked else 'no'}")
            mean = sum(hist) / len(hist) if hist else 0
            print(
                f"\nresync spread: max bucket / mean = {max(hist) / mean:.2f}"
                if mean
                else "\nresync spread: no reconciles in window"
            )
        finally:
            if (Path(tmp) / "operator.log").exists():
                kept = REPO / ".bench-logs"
                kept.mkdir(exist_ok=True)
                (kept / "steady-operator.log").write_bytes((Path(tmp) / "operator.log").read_bytes())
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
