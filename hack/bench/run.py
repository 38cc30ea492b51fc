#!/usr/bin/env python3
"""The issue-4 benchmarks, in one command; prints one table per benchmark, each figure beside its
anchor measured in the same run on the same control plane.

    .venv/bin/python hack/bench/run.py                      # full run (about 10-15 minutes on 2 cores)
    .venv/bin/python hack/bench/run.py --sizes 20 --stacks 20 --contenders bare,ours   # smoke run

1. Workqueue add/get/done cycles/s in-process (``bench_workqueue.py``), beside ``asyncio.Queue``.
2. Fan-out: N FanOut objects (a bench CRD with a status subresource) exist; each contender starts in
   a fresh process and writes ``status.observed`` on every one. Measured by the driver, which
   watches the objects: time from the contender's start (its imports done) until the last status is
   seen. Contenders: a bare kubernetes-asyncio loop (list, then patch at concurrency 25: the
   anchor), our machinery (Manager + controller, 25 workers), kopf (one-line handler; installed in
   ``.venv-bench`` only). Each gets its own fresh objects; all use the same cluster.
3. Informer cold sync: N Stack-shaped objects created with server-side apply (spec by one field
   manager, status by another, so managedFields are what an apiserver writes); time and RSS of
   caching them, in a fresh process, beside a bare kubernetes-asyncio list.

Also reported, to show what limits each run: CPU seconds used by the contender, the apiserver and
etcd during it (2 cores in all), and the PATCH requests the apiserver served for it.

``--json PATH`` writes every printed table's rows, every fan-out and informer run behind them, and the
record of the run (pko.devtools.benchrecord: date, commit, machine, load average at start and end, command).

The code: driver.py (what the drivers share), fanout.py (table 2), informer_sync.py (table 3), this file
(the command and its tables).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common import REPO, WORKERS, api_client
from driver import create_namespace, install_crds, log
from fanout import CONTENDER_LABELS, FanoutResult, ensure_bench_venv, run_fanout
from informer_sync import apply_stacks, object_sizes, run_informer_mem

from pko.devtools.benchrecord import recording
from pko.devtools.localcluster import LocalCluster

HERE = Path(__file__).resolve().parent


async def bench_cluster(args: argparse.Namespace, cluster: LocalCluster, logs: Path) -> tuple[Any, Any, Any]:
    api = await api_client(str(cluster.kubeconfig))
    async with api:
        await install_crds(api, cluster)
        fanouts: list[FanoutResult] = []
        for size in args.sizes:
            for rep in range(args.repeat):
                for contender in args.contenders:
                    if contender == "kopf" and rep > 0:
                        continue  # 3-4x slower than the rest; one run tells its story
                    fanouts.append(
                        await run_fanout(api, cluster, contender, size, f"r{rep}", logs, args.timeout)
                    )
        mem: list[dict[str, Any]] = []
        sizes = (0.0, 0.0)
        if args.stacks:
            await create_namespace(api, "stacks")
            log(f"informer: applying {args.stacks} Stacks (spec and status, server-side apply)")
            await apply_stacks(api, "stacks", args.stacks)
            sizes = await object_sizes(api, "stacks")
            for mode in ("bare", "ours", "ours-raw"):
                log(f"informer: {mode}")
                mem.append(run_informer_mem(cluster, "stacks", mode))
        return fanouts, mem, sizes


def fmt_ratio(x: float) -> str:
    return "-" if x != x else f"{x:.2f}x"  # NaN: no anchor in this run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_fanout(results: list[FanoutResult], kopf_version: str | None) -> None:
    print(f"\n## Fan-out: time from operator start until every object has a status ({WORKERS} workers)\n")
    print(
        "Times are the median of the runs (min-max in brackets); CPU seconds and PATCH counts are medians.\n"
    )
    print(
        "| N | contender | runs | start->done s | spawn->done s | vs anchor | vs bare loop on pko's client | "
        "target <= 1.15x | contender CPU s | apiserver CPU s | etcd CPU s | PATCH requests |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|:-:|---:|---:|---:|---:|")
    for size in sorted({r.size for r in results}):
        runs = {c: [r for r in results if r.size == size and r.contender == c] for c in CONTENDER_LABELS}
        anchor = median([r.start_to_done for r in runs["bare"]])
        same_client = median([r.start_to_done for r in runs["bare-pko"]])
        for name, rs in runs.items():
            if not rs:
                continue
            t = [r.start_to_done for r in rs]
            med = median(t)
            label = CONTENDER_LABELS[name] + (f" {kopf_version}" if name == "kopf" and kopf_version else "")
            vs_anchor = med / anchor if runs["bare"] else float("nan")
            vs_same = med / same_client if runs["bare-pko"] else float("nan")
            target = ("yes" if vs_anchor <= 1.15 else "NO") if name == "ours" and runs["bare"] else ""
            cpus = [r.contender_cpu for r in rs if r.contender_cpu >= 0]
            spread = f" ({min(t):.1f}-{max(t):.1f})" if len(t) > 1 else ""
            print(
                f"| {size} | {label} | {len(rs)} | {med:.2f}{spread} | "
                f"{median([r.spawn_to_done for r in rs]):.2f} | {fmt_ratio(vs_anchor)} | "
                f"{fmt_ratio(vs_same)} | "
                f"{target} | {median(cpus):.1f} | {median([r.apiserver_cpu for r in rs]):.1f} | "
                f"{median([r.etcd_cpu for r in rs]):.1f} | {median([r.patches for r in rs]):.0f} |"
            )


def print_informer(mem: list[dict[str, Any]], n: int, sizes: tuple[float, float]) -> None:
    mb = 1024 * 1024
    print(
        f"\n## Informer cold sync: {n} Stack-shaped objects ({sizes[0]:.1f} KB each as served with "
        f"managedFields, {sizes[1]:.1f} KB as cached)\n"
    )
    print(
        "| contender | sync s | vs bare list | RSS baseline MB | RSS after MB | RSS delta MB | peak MB | "
        "target < 150 MB: delta / after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|:-:|")
    bare = next((m for m in mem if m["mode"] == "bare"), None)
    labels = {
        "bare": "bare kubernetes-asyncio list, kept (anchor)",
        "ours": "pko informer (default transform)",
        "ours-raw": "pko informer, no transform (managedFields kept)",
    }
    for m in mem:
        ratio = m["seconds"] / bare["seconds"] if bare else float("nan")
        before, after = m["rss_baseline"] / mb, m["rss_after"] / mb
        target = ""
        if m["mode"] == "ours":
            target = f"{'yes' if after - before < 150 else 'NO'} / {'yes' if after < 150 else 'NO'}"
        print(
            f"| {labels[m['mode']]} ({m['objects']}) | {m['seconds']:.2f} | {fmt_ratio(ratio)} | "
            f"{before:.0f} | {after:.0f} | {after - before:.0f} | {m['peak'] / mb:.0f} | {target} |"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2000,10000", help="fan-out object counts (default %(default)s)")
    p.add_argument("--stacks", type=int, default=10000, help="Stacks for the informer benchmark (0 skips it)")
    p.add_argument(
        "--contenders", default="bare,bare-pko,ours,kopf", help="fan-out contenders (default %(default)s)"
    )
    p.add_argument("--repeat", type=int, default=3, help="fan-out runs per size and contender (kopf: once)")
    p.add_argument("--wq-rounds", type=int, default=200, help="bench_workqueue.py --rounds (0 skips it)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one fan-out run may take")
    p.add_argument(
        "--apiserver-arg", action="append", default=[], help="extra kube-apiserver flag (repeated)"
    )
    p.add_argument("--json", type=Path, help="write every printed figure, the runs and the run's record here")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(args.contenders) - set(CONTENDER_LABELS)
    if unknown:
        p.error(f"unknown contenders: {sorted(unknown)}")

    kopf_version = ensure_bench_venv() if "kopf" in args.contenders else None
    with recording("hack/bench/run.py", args.json, vars(args)) as run:
        fanouts, mem, sizes = measure(args)
        run.figures.update(
            kopf=kopf_version,
            fanout_runs=[asdict(r) for r in fanouts],
            informer_runs=mem,
            stack_kb={"served": sizes[0], "cached": sizes[1]},
        )
        print_tables(args, kopf_version, fanouts, mem, sizes)
    return 0


def measure(args: argparse.Namespace) -> tuple[list[FanoutResult], list[dict[str, Any]], tuple[float, float]]:
    """Every run of the benchmark; the workqueue's table is printed as bench_workqueue.py prints it."""
    print("# pko machinery benchmarks (issue 4)\n")
    print(
        f"machine: {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}; "
        f"python {sys.version.split()[0]}"
    )
    if args.wq_rounds:
        print("\n## Workqueue: add/get/done cycles per second, in-process (target >= 300k/s)\n")
        out = subprocess.run(
            [sys.executable, str(HERE / "bench_workqueue.py"), "--rounds", str(args.wq_rounds)],
            check=True,
            capture_output=True,
            text=True,
        )
        print(out.stdout.strip(), flush=True)

    with tempfile.TemporaryDirectory(prefix="pko-bench-") as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        cluster = LocalCluster(
            Path(tmp) / "cluster", extra_apiserver_args=args.apiserver_arg, with_controller_manager=False
        )
        log("starting a control plane")
        cluster.start()
        try:
            return asyncio.run(bench_cluster(args, cluster, logs))
        except BaseException:
            kept = REPO / ".bench-logs"
            subprocess.run(["rm", "-rf", str(kept)], check=False)
            subprocess.run(["cp", "-r", str(logs), str(kept)], check=False)
            log(f"failed; contender logs copied to {kept}")
            raise
        finally:
            cluster.stop()


def print_tables(
    args: argparse.Namespace,
    kopf_version: str | None,
    fanouts: list[FanoutResult],
    mem: list[dict[str, Any]],
    sizes: tuple[float, float],
) -> None:
    if fanouts:
        print_fanout(fanouts, kopf_version)
    if mem:
        print_informer(mem, args.stacks, sizes)
    print(
        f"\napiserver flags added: {' '.join(args.apiserver_arg) or 'none'}; load average at end "
        f"{os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
