"""What the operator costs before it reads a single object (issue 44), for git revisions side by side:
``import pko.__main__`` (its import time, memory and modules) and ``python -m pko`` started against a
control plane with no objects (the time to ready and the memory at ready).

    .venv/bin/python hack/bench/startup.py                          # HEAD alone (~1 min)
    .venv/bin/python hack/bench/startup.py --compare ed28d5a^       # a revision before, then HEAD (~2 min)
    .venv/bin/python hack/bench/startup.py --compare ed28d5a^ --compare 92ec610^ --rev 92ec610  # three
    .venv/bin/python hack/bench/startup.py --runs 1 --operator-runs 1 --json /tmp/s.json   # smoke
    .venv/bin/python hack/bench/startup.py --compare HEAD~1 --idle 1000 --profile /tmp/p.txt  # row 4

Every revision is checked out with ``git worktree add`` into a temporary directory (removed after) and
run with this interpreter (the development virtualenv) from its own tree: the editable install maps
``pko``, ``pko.api`` and ``pko.agent`` to the main checkout, so each process first puts a finder for the
tree's folders ahead of it; an import run fails if a module came from outside the tree (or the venv).

- Imports, ``--runs`` times, the revisions alternating: ``python -X importtime -c "import pko.__main__"``,
  its top-level cumulative times summed (all the interpreter imported, ``site`` included); then, in
  another process, VmRSS and VmHWM right after the same import, the modules loaded, kubernetes_asyncio's
  and cryptography's.
- The operator, ``--operator-runs`` times, alternating: ``python -m pko`` (``runpy``, after the finder)
  with leader election and loopback ports (the flags of test/machinery/test_operator_imports.py) and
  ``/metrics`` as by default (HTTPS, a self-signed certificate made at start), on a private control plane
  (pko.devtools.localcluster) holding the CRDs and nothing else: from spawn to ``/readyz`` answering 200
  (it leads and its caches synced), and its VmRSS and VmHWM then; SIGTERM after. Its ``PYTHONPATH`` is
  the tree, so a Python child it starts (the certificate's, since issue 44) imports ``pko`` from there too.
- With ``--idle N``, each operator run is followed by one over N Stacks waiting on a Program that does
  not exist (row 4 of hack/bench/sidebyside.py, without the node; made afresh, with no status, before
  each run): from spawn until it leads (its ``became leader`` log line), until every Stack has a status
  (a list every 0.25 s), and its CPU seconds then (``/proc``: user + system, with the children it
  waited for, the certificate's, as the pod's cgroup counts them) and VmRSS. Compare CPU seconds on a
  loaded machine: the wall times wait for a core. ``--profile PATH`` adds one more run per revision
  under py-spy (PyPI; installed into ``~/.cache/pko`` on first use; it samples from outside the process,
  so call-heavy code is not inflated as under pyinstrument's hook), from the first import to the exit
  after the first pass (not in the medians): its collapsed stacks, and the heaviest functions printed.

Prints one Markdown table of medians (a column per revision, then the ratio of the last to each one
before); ``--json PATH`` writes it with every run and the run's record (pko.devtools.benchrecord).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from common import REPO, api_client
from driver import bounded, exit_on_sigterm, free_port, log

from pko.controllers.resources import STACKS
from pko.devtools.benchrecord import recording
from pko.devtools.localcluster import ensure_binaries, private_cluster
from pko.machinery.resource import NAMESPACES, ResourceClient

HEADING = "Start-up: `import pko.__main__` and `python -m pko` with no objects"
# Run first in every measured process: the tree's own packages ahead of the editable install's mapping.
BOOT = """\
import sys
from importlib.machinery import PathFinder
class _TreeFinder:
    dirs = {dirs!r}
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return PathFinder.find_spec(name, [cls.dirs[name]]) if name in cls.dirs else None
sys.meta_path.insert(0, _TreeFinder)
"""
# Measured before anything else is imported; json only then.
PROBE = """\
import pko.__main__
def kb(field):
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(field + ':'))
rss, hwm, loaded = kb('VmRSS'), kb('VmHWM'), len(sys.modules)
kubernetes_asyncio = sum(1 for m in sys.modules if m.split('.')[0] == 'kubernetes_asyncio')
cryptography = sum(1 for m in sys.modules if m.split('.')[0] == 'cryptography')
files = [getattr(m, '__file__', None) or '' for m in list(sys.modules.values())]
outside = sorted(f for f in files if f.startswith({repo!r}) and not f.startswith(sys.prefix + '/'))
import json
print(json.dumps(dict(vmrss_kb=rss, vmhwm_kb=hwm, modules=loaded, pko_file=pko.__file__, outside=outside,
                      kubernetes_asyncio_modules=kubernetes_asyncio, cryptography_modules=cryptography)))
"""
PY_SPY = "0.4.3"
PY_SPY_DIR = Path.home() / ".cache/pko" / f"py-spy-{PY_SPY}"
IDLE_NAMESPACE = "idle"
POLL = 0.25  # s between two lists of the idle Stacks
RUN_OPERATOR = "import runpy\nrunpy.run_module('pko', run_name='__main__', alter_sys=True)\n"
IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")

# (key, row label, format): the table's rows, in order; the JSON's ``medians`` holds each unrounded.
FIGURES: list[tuple[str, str, Callable[[float], str]]] = [
    ("import_s", "`import pko.__main__`: import time (s)", "{:.2f}".format),
    ("import_vmrss_mb", "`import pko.__main__`: VmRSS after (MB)", "{:.0f}".format),
    ("import_vmhwm_mb", "`import pko.__main__`: VmHWM after (MB)", "{:.0f}".format),
    ("modules", "`import pko.__main__`: modules loaded", "{:.0f}".format),
    ("kubernetes_asyncio_modules", "`import pko.__main__`: of which kubernetes_asyncio's", "{:.0f}".format),
    ("cryptography_modules", "`import pko.__main__`: of which cryptography's", "{:.0f}".format),
    ("ready_s", "`python -m pko`, no objects: spawn -> ready (s)", "{:.2f}".format),
    ("ready_vmrss_mb", "`python -m pko`, no objects: VmRSS at ready (MB)", "{:.0f}".format),
    ("ready_vmhwm_mb", "`python -m pko`, no objects: VmHWM at ready (MB)", "{:.0f}".format),
    ("ready_cpu_s", "`python -m pko`, no objects: CPU at ready (s, children included)", "{:.2f}".format),
    ("idle_lease_s", "`--idle` Stacks: spawn -> leads (s)", "{:.2f}".format),
    ("idle_first_pass_s", "`--idle` Stacks: spawn -> every Stack has a status (s)", "{:.2f}".format),
    ("idle_cpu_s", "`--idle` Stacks: CPU, start-up and first pass (s, children included)", "{:.2f}".format),
    ("idle_vmrss_mb", "`--idle` Stacks: VmRSS after the first pass (MB)", "{:.0f}".format),
]


@dataclass
class Tree:
    rev: str
    commit: str
    path: Path

    @property
    def label(self) -> str:
        return f"{self.rev} ({self.commit[:7]})"

    def boot(self) -> str:
        """BOOT for this tree: each package of its pyproject's ``package-dir`` found in its folder."""
        mapping = tomllib.loads((self.path / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ]
        dirs = {}
        for package, folder in mapping.items():
            if Path(folder).name != package.rpartition(".")[2]:
                raise RuntimeError(f"{self.rev}: package-dir {package} = {folder}: not a folder of that name")
            dirs[package] = str((self.path / folder).parent)
        return BOOT.format(dirs=dirs)


def importtime_total(stderr: str) -> float:
    """Seconds: the cumulative times of the top-level imports in a ``-X importtime`` log, summed."""
    return sum(int(m[2]) for m in map(IMPORT_LINE.match, stderr.splitlines()) if m and not m[3]) / 1e6


def measure_import(tree: Tree) -> dict[str, Any]:
    timed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", tree.boot() + "import pko.__main__\n"],
        cwd=tree.path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    probe = subprocess.run(
        [sys.executable, "-c", tree.boot() + PROBE.format(repo=f"{REPO}/")],
        cwd=tree.path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    run: dict[str, Any] = json.loads(probe.stdout)
    if not Path(run["pko_file"]).is_relative_to(tree.path) or run.pop("outside"):
        raise RuntimeError(f"{tree.label}: imported from outside its tree: {probe.stdout}")
    return {
        "import_s": importtime_total(timed.stderr),
        "import_vmrss_mb": run["vmrss_kb"] / 1024,
        "import_vmhwm_mb": run["vmhwm_kb"] / 1024,
        "modules": run["modules"],
        "kubernetes_asyncio_modules": run["kubernetes_asyncio_modules"],
        "cryptography_modules": run["cryptography_modules"],
        "pko_file": run["pko_file"],
    }


def status_mb(pid: int) -> dict[str, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM")}


def ensure_py_spy() -> Path:
    """py-spy (PyPI), installed into ``~/.cache/pko`` on first use: never a project dependency."""
    if not (PY_SPY_DIR / "bin" / "py-spy").exists():
        log(f"installing py-spy {PY_SPY} into {PY_SPY_DIR}")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(PY_SPY_DIR), f"py-spy=={PY_SPY}"],
            check=True,
        )
    return PY_SPY_DIR / "bin" / "py-spy"


def operator_pid(proc: subprocess.Popen[bytes]) -> int:
    """The operator's pid: ``proc``'s, or under py-spy its child's."""
    if Path(proc.args[0]).name != "py-spy":  # type: ignore[index]
        return proc.pid
    for _ in range(200):
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise RuntimeError("py-spy started no operator")


def hottest(collapsed: Path, top: int = 25) -> str:
    """py-spy's collapsed stacks summed by function (line numbers dropped), the event loop's waits in
    ``select`` left out: the heaviest by own samples, then pko's by total samples."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")], int(count)
        if frames[-1].split(" ")[0].endswith("Selector.select"):
            continue
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            if "pko/" in frame or "api/" in frame:
                total[frame] = total.get(frame, 0) + n

    def heaviest(counts: dict[str, int]) -> list[str]:
        ranked = sorted(counts.items(), key=lambda x: -x[1])[:top]
        return [f"  {n:6d} {n / max(samples, 1):6.1%}  {f}" for f, n in ranked]

    return "\n".join(
        [f"{samples} samples (not waiting in select); by own samples:", *heaviest(own),
         "pko's functions by total samples:", *heaviest(total)]
    )  # fmt: skip


def process_cpu_s(pid: int) -> float:
    """User + system CPU of a process and of its children it has waited for (the certificate's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def led_at(log_path: Path) -> float | None:
    """The wall time (epoch s) of the operator's ``became leader`` log line, if written yet."""
    for line in log_path.read_text().splitlines():
        if '"became leader"' in line:
            return datetime.fromisoformat(json.loads(line)["ts"]).timestamp()
    return None


def measure_operator(
    tree: Tree, kubeconfig: Path, n: int, logs: Path, idle: int = 0, profile: Path | None = None
) -> dict[str, Any]:
    """Spawn -> ready with no objects; with ``idle`` (that many Stacks waiting, made just before by
    :func:`fresh_idle_stacks`): spawn -> leads, -> every Stack has a status, and the CPU then."""
    probe = free_port()
    args = [
        sys.executable, "-c", tree.boot() + RUN_OPERATOR,
        f"--kubeconfig={kubeconfig}",
        "--leader-elect",
        f"--leader-election-id=startup-{n}-{probe}",
        "--leader-election-namespace=default",
        f"--metrics-bind-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        "--program-fs-addr=127.0.0.1:0",
        "--log-format=json",
    ]  # fmt: skip
    if profile is not None:  # py-spy samples from outside: no overhead in the process
        args = [str(ensure_py_spy()), "record", "-r", "250", "-f", "raw", "-o", str(profile), "--", *args]
    log_path = logs / f"operator-{tree.commit[:7]}-{n}{'-idle' if idle else ''}.log"
    with log_path.open("w") as err:
        began, began_wall = time.monotonic(), time.time()
        env = {**os.environ, "PYTHONPATH": str(tree.path)}
        proc = subprocess.Popen(args, cwd=tree.path, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        if idle:
            return asyncio.run(first_pass(tree, kubeconfig, idle, proc, log_path, began, began_wall))
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=1) as answer:
                    if answer.status == 200:
                        break
            if proc.poll() is not None or time.monotonic() - began > 120:
                raise RuntimeError(
                    f"{tree.label}: the operator was not ready:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.05)
        ready, cpu = time.monotonic() - began, process_cpu_s(proc.pid)
        memory = status_mb(proc.pid)
    finally:
        with contextlib.suppress(OSError, RuntimeError):  # py-spy writes its profile when it exits
            os.kill(operator_pid(proc), signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {
        "ready_s": ready,
        "ready_cpu_s": cpu,
        "ready_vmrss_mb": memory["VmRSS"],
        "ready_vmhwm_mb": memory["VmHWM"],
    }


def tail(log_path: Path) -> str:
    return log_path.read_text()[-3000:]


async def first_pass(
    tree: Tree, kubeconfig: Path, idle: int, proc: subprocess.Popen[bytes], log_path: Path,
    began: float, began_wall: float,
) -> dict[str, Any]:  # fmt: skip
    """Poll the Stacks (a list every ``POLL`` s) until each has a status; then the process's CPU."""
    api = await api_client(str(kubeconfig), pko_client=True)
    async with api:
        stacks = ResourceClient(api, STACKS, IDLE_NAMESPACE)
        while True:
            if proc.poll() is not None or time.monotonic() - began > 600:
                raise RuntimeError(f"{tree.label}: no first pass:\n{tail(log_path)}")
            listed = await stacks.list()
            done = sum(1 for s in listed.items if s.get("status"))
            if done >= idle:
                break
            await asyncio.sleep(POLL)
    pid = operator_pid(proc)
    passed, cpu = time.monotonic() - began, process_cpu_s(pid)
    memory = status_mb(pid)
    led = led_at(log_path)
    if led is None:
        raise RuntimeError(f"{tree.label}: no 'became leader' in {log_path}")
    return {
        "idle_lease_s": led - began_wall,
        "idle_first_pass_s": passed,
        "idle_cpu_s": cpu,
        "idle_vmrss_mb": memory["VmRSS"],
    }


async def fresh_idle_stacks(kubeconfig: Path, n: int) -> None:
    """``n`` Stacks with no status naming a Program that does not exist (row 4's missing-program shape
    of hack/bench/peerscale_idle.py), the last run's removed first (their finalizers stripped)."""
    api = await api_client(str(kubeconfig), pko_client=True)
    async with api:
        stacks = ResourceClient(api, STACKS, IDLE_NAMESPACE)
        if await ResourceClient(api, NAMESPACES).get_or_none(IDLE_NAMESPACE) is None:
            await ResourceClient(api, NAMESPACES).create({"metadata": {"name": IDLE_NAMESPACE}})
        old = [s["metadata"]["name"] for s in (await stacks.list()).items]

        async def remove(i: int) -> None:
            await stacks.patch(old[i], {"metadata": {"finalizers": None}})
            with contextlib.suppress(Exception):
                await stacks.delete(old[i])

        await bounded(len(old), 8, remove)

        async def make(i: int) -> None:
            spec = {"stack": "dev", "programRef": {"name": "absent"}}
            await stacks.create({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                                 "metadata": {"name": f"idle-{i:05d}"}, "spec": spec})  # fmt: skip

        await bounded(n, 8, make)


@contextlib.contextmanager
def checked_out(revs: list[str], base: Path) -> Iterator[list[Tree]]:
    """Each revision in a worktree of its own under ``base``, compiled and imported once; removed after."""
    trees: list[Tree] = []
    try:
        for i, rev in enumerate(revs):
            resolve = ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"]
            commit = subprocess.run(
                resolve, cwd=REPO, capture_output=True, text=True, check=True
            ).stdout.strip()
            path = base / f"tree{i}"
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(path), commit], cwd=REPO, check=True
            )
            trees.append(Tree(rev, commit, path))
            packages = [str(path / folder) for folder in ("pko", "api", "agent") if (path / folder).is_dir()]
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", *packages], check=True, capture_output=True
            )
        for tree in trees:  # a warm-up, not counted: the tree's and the virtualenv's files read once
            subprocess.run(
                [sys.executable, "-c", tree.boot() + "import pko.__main__\n"], cwd=tree.path, check=True
            )
        yield trees
    finally:
        for tree in trees:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree.path)], cwd=REPO, check=False)


def medians(*runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per figure, per revision label: the median of its runs (the lower middle for counts)."""
    out: dict[str, dict[str, float]] = {}
    for key, _, _ in FIGURES:
        for label in runs[0]:
            rows = [row for per in runs for row in per[label]]
            values = [row[key] for row in rows if key in row]
            if not values:
                continue
            pick = statistics.median_low if isinstance(values[0], int) else statistics.median
            out.setdefault(key, {})[label] = pick(values)
    return out


def table(labels: list[str], mid: dict[str, dict[str, float]]) -> str:
    """A column per revision, then the last one's ratio to each before it (``ratio``, with two)."""
    *before, last = labels
    ratios = ["ratio"] if len(before) == 1 else [f"ratio to {label.split()[0]}" for label in before]
    lines = [
        "| figure | " + " | ".join(labels + ratios) + " |",
        "|---|" + "---:|" * (len(labels) + len(ratios)),
    ]
    for key, name, fmt in FIGURES:
        if key not in mid:
            continue
        cells = [fmt(mid[key][label]) for label in labels]
        for label in before:
            first, second = mid[key][label], mid[key][last]
            cells.append(f"{second / first:.2f}x" if first else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(
    trees: list[Tree], runs: int, operator_runs: int, figures: dict[str, Any], idle: int = 0,
    profile: Path | None = None,
) -> None:  # fmt: skip
    """Fill ``figures["imports"]`` and ``figures["operator"]``: per revision label, one dict per run
    (with ``idle``, one per run with no objects and one per run over that many idle Stacks)."""
    imports: dict[str, list[dict[str, Any]]] = {tree.label: [] for tree in trees}
    operator: dict[str, list[dict[str, Any]]] = {tree.label: [] for tree in trees}
    figures["imports"], figures["operator"] = imports, operator
    for n in range(runs):
        for tree in trees:
            imports[tree.label].append(measure_import(tree))
            log(f"import run {n + 1}/{runs} {tree.label}: {imports[tree.label][-1]['import_s']:.2f} s")
    logs = REPO / ".bench-logs" / "startup"
    logs.mkdir(parents=True, exist_ok=True)
    with private_cluster("pko-bench-startup-") as cluster:
        crds = trees[-1].path / "config" / "crd" / "bases"
        kube = [str(ensure_binaries() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run([*kube, "apply", "--server-side", "-f", str(crds)], check=True, capture_output=True)
        for _ in range(120):  # a CRD with no conditions yet fails `kubectl wait` at once: ask again
            established = ["wait", "--for=condition=established", "--timeout=60s", "crd", "--all"]
            if subprocess.run([*kube, *established], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the CRDs were not established")
        for n in range(operator_runs):
            for tree in trees if n % 2 == 0 else trees[::-1]:
                operator[tree.label].append(measure_operator(tree, cluster.kubeconfig, n, logs))
                ready = operator[tree.label][-1]["ready_s"]
                log(f"operator run {n + 1}/{operator_runs} {tree.label}: ready {ready:.2f} s")
                if idle:
                    asyncio.run(fresh_idle_stacks(cluster.kubeconfig, idle))
                    row = measure_operator(tree, cluster.kubeconfig, n, logs, idle)
                    operator[tree.label].append(row)
                    log(f"idle run {n + 1}/{operator_runs} {tree.label}: " + json.dumps(row))
        if profile is not None:
            for tree in trees:
                out = profile.with_name(f"{profile.stem}-{tree.commit[:7]}{profile.suffix}")
                asyncio.run(fresh_idle_stacks(cluster.kubeconfig, idle or 1))
                measure_operator(tree, cluster.kubeconfig, operator_runs, logs, idle or 1, out)
                log(f"profile of {tree.label} (py-spy's collapsed stacks): {out}\n{hottest(out)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="the revision measured (default %(default)s)")
    p.add_argument(
        "--compare",
        metavar="REV",
        action="append",
        default=[],
        help="a revision measured beside it, its column first (repeat for more, in order)",
    )
    p.add_argument("--runs", type=int, default=7, help="import runs per revision (default %(default)s)")
    p.add_argument("--operator-runs", type=int, default=3, help="per revision (default %(default)s)")
    p.add_argument("--json", type=Path, help="write every figure, every run and the run's record here")
    p.add_argument(
        "--idle",
        type=int,
        default=0,
        metavar="N",
        help="also, per operator run, N Stacks waiting on a missing Program: spawn -> leads and -> every"
        " Stack has a status, the CPU then (row 4 of hack/bench/sidebyside.py without a node)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="after the runs, one more per revision under py-spy (not in the medians), from its first"
        " import to the end of its first pass over --idle Stacks: collapsed stacks in PATH-<commit>",
    )
    args = p.parse_args(argv)
    exit_on_sigterm()
    revs = [*args.compare, args.rev]
    with (
        recording("hack/bench/startup.py", args.json, vars(args), argv) as run,
        tempfile.TemporaryDirectory(prefix="pko-bench-startup-") as tmp,
        checked_out(revs, Path(tmp)) as trees,
    ):
        run.figures["interpreter"] = sys.executable
        run.figures["revisions"] = [{"rev": t.rev, "commit": t.commit, "label": t.label} for t in trees]
        measure(trees, args.runs, args.operator_runs, run.figures, args.idle, args.profile)
        labels = [tree.label for tree in trees]
        run.figures["medians"] = mid = medians(run.figures["imports"], run.figures["operator"])
        print(f"## {HEADING}\n")
        print(f"Medians of {args.runs} import and {args.operator_runs} operator runs each, alternating.\n")
        print(table(labels, mid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
