"""Steady state at scale (issue 9): N deployed Stacks (each with its Workspace, StatefulSet, Service
and completed Update, see fleet.py) tracking branches on a loopback git server, the real operator
(``python -m pko``) started against them; once its first pass over the fleet has ended (every Stack
reconciled, no write for ``--quiet`` seconds), it is sampled for a window: RSS, CPU % of one core,
API writes, git requests, and when reconciles fire (controller_runtime_reconcile_total deltas per
bucket: branch polls spread, not bunched). During the first pass a sampler polls ``/healthz`` and
``/metrics`` twice a second and reports the slowest answers (a kubelet probe times out after 1 s)
and the largest event-loop heartbeat age the operator exported (liveness fails past 60 s).

One command, its own control plane (hack/localcluster.py):

    .venv/bin/python hack/bench/steady.py --stacks 10000 --duration 300
    .venv/bin/python hack/bench/steady.py --stacks 50 --duration 10 --resync 60   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import REPO, api_client
from driver import (
    cpu_seconds,
    create_namespace,
    exit_on_sigterm,
    free_port,
    install_crds,
    log,
    rss_mb,
    stop_and_keep_log,
)
from fleet import GitServer, Seeded, git_server, seed_fleet
from prometheus_client.parser import text_string_to_metric_families

from pko.controllers.options import ControllerOptions
from pko.devtools.benchrecord import recording
from pko.devtools.localcluster import LocalCluster

Obj = dict[str, Any]


def reconciles(port: int) -> dict[str, float]:
    """controller_runtime_reconcile_total summed per controller."""
    # Generous: during its first pass over 10,000 objects the operator's loop answers slowly.
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
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


class ProbeSampler:
    """Polls ``/healthz`` and ``/metrics`` every ``interval`` s, each from a thread of its own (a
    slow answer delays only its own series): the slowest answer of each, how many took over 1 s
    (a kubelet probe's timeout) or failed, and the largest ``pko_event_loop_heartbeat_age_seconds``
    seen (None from an operator that does not export it)."""

    def __init__(self, probe_port: int, metrics_port: int, interval: float = 0.5) -> None:
        self.urls = {
            "healthz": f"http://127.0.0.1:{probe_port}/healthz",
            "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
        }
        self.interval = interval
        self.slowest = dict.fromkeys(self.urls, 0.0)
        self.samples = dict.fromkeys(self.urls, 0)
        self.over_1s = dict.fromkeys(self.urls, 0)
        self.failed = dict.fromkeys(self.urls, 0)
        self.heartbeat_age: float | None = None
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, args=(k,), daemon=True) for k in self.urls]

    def __enter__(self) -> ProbeSampler:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _poll(self, key: str) -> None:
        while not self._stop.wait(self.interval):
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.urls[key], timeout=60) as resp:
                    text = resp.read().decode()
                ok = resp.status == 200
            except OSError:  # HTTPError (a failing probe) and timeouts alike
                text, ok = "", False
            took = time.monotonic() - started
            self.samples[key] += 1
            self.slowest[key] = max(self.slowest[key], took)
            self.over_1s[key] += took > 1.0
            self.failed[key] += not ok
            for line in text.splitlines() if key == "metrics" else ():
                if line.startswith("pko_event_loop_heartbeat_age_seconds "):
                    age = float(line.split()[1])
                    self.heartbeat_age = max(self.heartbeat_age or 0.0, age)

    def figures(self) -> dict[str, Any]:
        """Per endpoint the slowest answer, the answers over 1 s, the failed and all sampled; the largest
        heartbeat age (None: not exported)."""
        per = {
            key: {
                "slowest_s": self.slowest[key],
                "over_1s": self.over_1s[key],
                "failed": self.failed[key],
                "sampled": self.samples[key],
            }
            for key in self.urls
        }
        return {**per, "heartbeat_age_max_s": self.heartbeat_age}


def probe_rows(probes: dict[str, Any]) -> list[str]:
    """ProbeSampler.figures() as rows of the figures table."""
    out = []
    for key in ("healthz", "metrics"):
        p = probes[key]
        out.append(f"| first pass: slowest /{key} answer (s) | {p['slowest_s']:.2f} | < 1 |")
        out.append(
            f"| first pass: /{key} answers over 1 s / failed / sampled | {p['over_1s']} / "
            f"{p['failed']} / {p['sampled']} | 0 / 0 / - |"
        )
    age = probes["heartbeat_age_max_s"]
    shown = "n/a" if age is None else f"{age:.2f}"
    out.append(f"| first pass: largest event-loop heartbeat age (s) | {shown} | < 60 (liveness) |")
    return out


NAMESPACE = "stacks"
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


async def seed(cluster: LocalCluster, n: int, git: GitServer, teams: int, resync: int) -> Seeded:
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
        await create_namespace(api, NAMESPACE)
        log(f"seeding {n} deployed Stacks (Stack, Workspace, StatefulSet, Service, Update each)")
        return await seed_fleet(
            api, NAMESPACE, n, git, teams=teams, resync=resync, options=ControllerOptions()
        )


def write_deltas(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> list[Obj]:
    """The write requests served between two readings of api_writes(), by verb and resource (those with
    none left out), then their sum as ``all``."""
    rows: list[Obj] = []
    for verb, resource in sorted(after):
        delta = after[verb, resource] - before.get((verb, resource), 0.0)
        if delta:
            rows.append({"verb": verb, "resource": resource, "writes": delta})
    rows.append({"verb": "all", "resource": "all", "writes": sum(after.values()) - sum(before.values())})
    return rows


def print_writes(rows: list[Obj]) -> None:
    print("| verb | resource | writes |")
    print("|---|---|---:|")
    for row in rows:
        print(f"| {row['verb']} | {row['resource']} | {row['writes']:.0f} |")


def start_operator(cluster: LocalCluster, logf: Any) -> tuple[subprocess.Popen[bytes], int, int]:
    """The operator's process, metrics port and probes port, once it serves metrics."""
    mport, pport = free_port(), free_port()
    cmd = [
        sys.executable, "-m", "pko", "--kubeconfig", str(cluster.kubeconfig),
        # Plain HTTP: the slowest /metrics answers measure collection on a busy process, not a
        # TokenReview on a cache miss (which waits for the loop; docs/security.md).
        "--metrics-bind-address", f"127.0.0.1:{mport}", "--metrics-secure=false",
        "--health-probe-bind-address", f"127.0.0.1:{pport}",
        "--program-fs-addr", f"127.0.0.1:{free_port()}",
        "--leader-elect=false",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            reconciles(mport)
            return proc, mport, pport
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("operator did not serve metrics") from None
            time.sleep(0.5)


def first_pass(
    cluster: LocalCluster, proc: subprocess.Popen[bytes], mport: int, n: int, quiet: float, timeout: float
) -> tuple[float, float]:
    """Wait until every Stack was reconciled and the operator wrote nothing for ``quiet`` seconds;
    returns the seconds until every Stack was reconciled and until the last write."""
    t0 = time.monotonic()
    last_writes, quiet_since = api_writes(cluster), time.monotonic()
    reported = t0
    reconciled: float | None = None
    while time.monotonic() - t0 < timeout:
        time.sleep(2)
        if proc.poll() is not None:
            raise RuntimeError("the operator exited during its first pass")
        writes = api_writes(cluster)
        if sum(writes.values()) != sum(last_writes.values()):
            last_writes, quiet_since = writes, time.monotonic()
        counts = reconciles(mport)
        done = counts.get("stack-controller", 0.0) >= n
        if done and reconciled is None:
            reconciled = time.monotonic() - t0
        if time.monotonic() - reported >= 30:
            reported = time.monotonic()
            log(f"first pass: reconciles {counts}, writes so far {sum(writes.values()):.0f}")
        if reconciled is not None and time.monotonic() - quiet_since >= quiet:
            return reconciled, quiet_since - t0
    raise RuntimeError(f"the operator's first pass did not end within {timeout:.0f}s")


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stacks", type=int, default=10000)
    p.add_argument("--duration", type=float, default=300.0, help="window in seconds (default %(default)s)")
    p.add_argument("--buckets", type=int, default=10, help="histogram buckets over the window")
    p.add_argument("--teams", type=int, default=37, help="git repositories the Stacks track (one per team)")
    p.add_argument(
        "--resync", type=int, default=300, help="the Stacks' resyncFrequencySeconds (branch polls)"
    )
    p.add_argument("--quiet", type=float, default=15.0, help="write-free seconds that end the first pass")
    p.add_argument("--first-pass-timeout", type=float, default=3600.0)
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = p.parse_args()
    with recording("hack/bench/steady.py", args.json, vars(args)) as run:
        run.figures.update(measure(args))
        print_tables(run.figures)
    return 0


def measure(args: argparse.Namespace) -> Obj:
    """Every figure of the run, as the tables print them and the JSON records them."""
    with tempfile.TemporaryDirectory(prefix="pko-steady-") as tmp, git_server(args.teams) as git:
        cluster = LocalCluster(Path(tmp) / "cluster", with_controller_manager=False)
        log("starting a control plane")
        cluster.start()
        proc = None
        log_path = Path(tmp) / "operator.log"
        try:
            t = time.monotonic()
            seeded = asyncio.run(seed(cluster, args.stacks, git, args.teams, args.resync))
            log(f"seeded in {time.monotonic() - t:.0f}s: {seeded}")
            logf = open(log_path, "w")
            w_start = api_writes(cluster)
            git_start = git.requests[0]
            proc, mport, pport = start_operator(cluster, logf)
            log("operator up; waiting for its first pass over the fleet")
            with ProbeSampler(pport, mport) as probes:
                took, last_write = first_pass(
                    cluster, proc, mport, args.stacks, args.quiet, args.first_pass_timeout
                )
            r0 = reconciles(mport)
            w0 = api_writes(cluster)
            git0 = git.requests[0]
            log(f"first pass done in {took:.0f}s; sampling for {args.duration:.0f}s")
            step = args.duration / args.buckets
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
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
            git1 = git.requests[0]
            cached = informers(log_path)
        finally:
            stop_and_keep_log(proc, log_path, "steady-operator.log")
            cluster.stop()
    mean = sum(hist) / len(hist) if hist else 0
    return {
        "seeded": asdict(seeded),
        "teams": args.teams,
        "resync_s": args.resync,
        "window_s": args.duration,
        "operator_rss_end_mb": rss,
        "operator_rss_peak_mb": peak,
        "operator_cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "first_pass_reconciled_s": took,
        "first_pass_last_write_s": last_write,
        "git_requests_first_pass": git0 - git_start,
        "git_requests_window": git1 - git0,
        "probes_first_pass": probes.figures(),
        "reconciles_first_pass": r0,
        "reconciles_window": {c: prev.get(c, 0) - r0.get(c, 0) for c in prev},
        "buckets": [{"start_s": i * step, "reconciles": h} for i, h in enumerate(hist)],
        "resync_spread": max(hist) / mean if mean else None,
        "writes_first_pass": write_deltas(w_start, w0),
        "writes_window": write_deltas(w0, w1),
        "informers": [{"resource": r, "namespace": ns} for r, ns in cached],
        "secrets_configmaps_cached": [r for r, _ in cached if r in ("secrets", "configmaps")],
    }


def print_tables(f: Obj) -> None:
    """The run's tables, from the figures measure() took (the same dict the JSON records)."""
    seeded = f["seeded"]
    print("# pko steady state at scale (issue 9)\n")
    print(
        f"Seeded: {seeded['stacks']} Stacks with {seeded['workspaces']} Workspaces, "
        f"{seeded['statefulsets']} StatefulSets, {seeded['services']} Services, {seeded['pods']} Ready pods, "
        f"{seeded['updates']} Updates; branches on {f['teams']} loopback git repositories, "
        f"resyncFrequencySeconds {f['resync_s']}; window {f['window_s']:.0f} s after the first pass"
    )
    print("\n## The operator after its first pass\n")
    print("| figure | value | target |")
    print("|---|---:|---|")
    print(f"| operator RSS at end (MB) | {f['operator_rss_end_mb']:.0f} | <= 400 |")
    print(f"| operator RSS peak in window (MB) | {f['operator_rss_peak_mb']:.0f} | <= 400 |")
    print(f"| operator CPU % of one core over the window | {f['operator_cpu_pct']:.1f} | <= 5 |")
    print(
        f"| first pass: operator start to every Stack reconciled (s) | {f['first_pass_reconciled_s']:.0f} | |"
    )
    print(f"| first pass: operator start to its last write (s) | {f['first_pass_last_write_s']:.0f} | |")
    print(f"| git requests in the first pass / in the window | {f['git_requests_first_pass']} / "
          f"{f['git_requests_window']} | one per repository per interval |")  # fmt: skip
    print("\n".join(probe_rows(f["probes_first_pass"])))
    print(f"\nreconciles in the first pass: {f['reconciles_first_pass']}")
    print(f"\nreconciles per controller in the window: {f['reconciles_window']}")
    print("\n## Reconciles per bucket of the window\n")
    print("| bucket start s | reconciles |")
    print("|---:|---:|")
    for bucket in f["buckets"]:
        print(f"| {bucket['start_s']:.0f} | {bucket['reconciles']:.0f} |")
    spread = f["resync_spread"]
    print(
        f"\nresync spread: max bucket / mean = {spread:.2f}"
        if spread is not None
        else "\nresync spread: no reconciles in the window"
    )
    print("\n## API writes in the first pass (only the operator writes then)\n")
    print_writes(f["writes_first_pass"])
    print("\n## API writes in the window\n")
    print_writes(f["writes_window"])
    cached = [(i["resource"], i["namespace"]) for i in f["informers"]]
    print(f"\ninformers synced (resource, namespace): {cached}")
    leaked = f["secrets_configmaps_cached"]
    print(f"Secrets/ConfigMaps cached: {'yes: ' + ', '.join(leaked) if leaked else 'no'}")


if __name__ == "__main__":
    sys.exit(main())
