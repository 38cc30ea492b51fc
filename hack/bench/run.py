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
record of the run (common.start_record: date, commit, machine, load average at start and end, command).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import (
    FANOUT_CRD,
    GROUP,
    KIND,
    PLURAL,
    REPO,
    STACK_GROUP,
    STACK_PLURAL,
    STACK_VERSION,
    VERSION,
    WORKERS,
    api_client,
    finish_record,
    stack_spec,
    stack_status,
    start_record,
    table_rows,
    write_record,
)
from prometheus_client.parser import text_string_to_metric_families

from pko.devtools.localcluster import LocalCluster
from pko.machinery.resource import NAMESPACES, Resource, ResourceClient

HERE = Path(__file__).resolve().parent
BENCH_VENV = REPO / ".venv-bench"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
FANOUTS = Resource(GROUP, VERSION, PLURAL, KIND)
TICKS = os.sysconf("SC_CLK_TCK")
CREATE_CONCURRENCY = 50
CONTENDER_LABELS = {
    "bare": "bare kubernetes-asyncio loop (anchor)",
    "bare-pko": "bare loop on pko's ApiClient",
    "ours": "pko machinery (Manager, 25 workers)",
    "kopf": "kopf, one-line handler",
}


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


async def apply_stacks(
    api: Any, namespace: str, n: int, spec: Callable[[int], dict[str, Any]] = stack_spec
) -> None:
    from kubernetes_asyncio import client

    objects = client.CustomObjectsApi(api)
    args = (STACK_GROUP, STACK_VERSION, namespace, STACK_PLURAL)

    async def make(i: int) -> None:
        name = f"stack-{i:05d}"
        await objects.patch_namespaced_custom_object(
            *args,
            name,
            spec(i),
            field_manager="kubectl",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        await objects.patch_namespaced_custom_object_status(
            *args,
            name,
            stack_status(i),
            field_manager="pulumi-kubernetes-operator",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

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


# --- informer memory -----------------------------------------------------------------------------


def run_informer_mem(cluster: LocalCluster, namespace: str, mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / "informer_mem.py"), str(cluster.kubeconfig), namespace, mode],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def object_sizes(api: Any, namespace: str) -> tuple[float, float]:
    """Mean JSON size of a Stack as served and as cached (transformed), in KB, over a sample."""
    from pko.machinery.informer import strip_managed_fields

    stacks = Resource(STACK_GROUP, STACK_VERSION, STACK_PLURAL, "Stack")
    page = await ResourceClient(api, stacks, namespace).list(limit=50)
    served = [len(json.dumps(o)) for o in page.items]
    cached = [len(json.dumps(strip_managed_fields(o))) for o in page.items]
    return sum(served) / len(served) / 1024, sum(cached) / len(cached) / 1024


# --- the run -------------------------------------------------------------------------------------


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


class Tee(io.StringIO):
    """Stdout that is also kept, so ``--json`` holds exactly the tables that were printed."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        return super().write(text)

    def flush(self) -> None:
        self.out.flush()


def tables_by_heading(markdown: str) -> dict[str, list[dict[str, str]]]:
    """Each ``## heading``'s table rows, keyed by the heading."""
    tables: dict[str, list[dict[str, str]]] = {}
    for section in markdown.split("\n## ")[1:]:
        heading, _, body = section.partition("\n")
        tables[heading.strip()] = table_rows(body)
    return tables


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
    record = start_record("hack/bench/run.py")
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(args.contenders) - set(CONTENDER_LABELS)
    if unknown:
        p.error(f"unknown contenders: {sorted(unknown)}")

    kopf_version = ensure_bench_venv() if "kopf" in args.contenders else None
    printed = Tee(sys.stdout)
    with contextlib.redirect_stdout(printed):
        fanouts, mem, sizes = bench_and_print(args, kopf_version)
    if args.json:
        figures = {
            "kopf": kopf_version,
            "tables": tables_by_heading(printed.getvalue()),
            "fanout_runs": [asdict(r) for r in fanouts],
            "informer_runs": mem,
            "stack_kb": {"served": sizes[0], "cached": sizes[1]},
            "printed": printed.getvalue(),
        }
        write_record(args.json, finish_record(record, figures))
        log(f"raw figures: {args.json}")
    return 0


def bench_and_print(
    args: argparse.Namespace, kopf_version: str | None
) -> tuple[list[FanoutResult], list[dict[str, Any]], tuple[float, float]]:
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
            fanouts, mem, sizes = asyncio.run(bench_cluster(args, cluster, logs))
        except BaseException:
            kept = REPO / ".bench-logs"
            subprocess.run(["rm", "-rf", str(kept)], check=False)
            subprocess.run(["cp", "-r", str(logs), str(kept)], check=False)
            log(f"failed; contender logs copied to {kept}")
            raise
        finally:
            cluster.stop()
    if fanouts:
        print_fanout(fanouts, kopf_version)
    if mem:
        print_informer(mem, args.stacks, sizes)
    print(
        f"\napiserver flags added: {' '.join(args.apiserver_arg) or 'none'}; load average at end "
        f"{os.getloadavg()[0]:.2f}"
    )
    return fanouts, mem, sizes


if __name__ == "__main__":
    sys.exit(main())
