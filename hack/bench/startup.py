"""What the operator costs before it reads a single object (issue 44), for git revisions side by side:
``import pko.__main__`` (its import time, memory and modules) and ``python -m pko`` started against a
control plane with no objects (the time to ready and the memory at ready).

    .venv/bin/python hack/bench/startup.py                          # HEAD alone (~1 min)
    .venv/bin/python hack/bench/startup.py --compare ed28d5a^       # a revision before, then HEAD (~2 min)
    .venv/bin/python hack/bench/startup.py --compare ed28d5a^ --compare 92ec610^ --rev 92ec610  # three
    .venv/bin/python hack/bench/startup.py --runs 1 --operator-runs 1 --json /tmp/s.json   # smoke

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

Prints one Markdown table of medians (a column per revision, then the ratio of the last to each one
before); ``--json PATH`` writes it with every run and the run's record (pko.devtools.benchrecord).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import REPO
from driver import exit_on_sigterm, free_port, log

from pko.devtools.benchrecord import recording
from pko.devtools.localcluster import ensure_binaries, private_cluster

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


def measure_operator(tree: Tree, kubeconfig: Path, n: int, logs: Path) -> dict[str, Any]:
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
    log_path = logs / f"operator-{tree.commit[:7]}-{n}.log"
    with log_path.open("w") as err:
        began = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(tree.path)}
        proc = subprocess.Popen(args, cwd=tree.path, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
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
        ready = time.monotonic() - began
        memory = status_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"ready_s": ready, "ready_vmrss_mb": memory["VmRSS"], "ready_vmhwm_mb": memory["VmHWM"]}


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
        cells = [fmt(mid[key][label]) for label in labels]
        for label in before:
            first, second = mid[key][label], mid[key][last]
            cells.append(f"{second / first:.2f}x" if first else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(trees: list[Tree], runs: int, operator_runs: int, figures: dict[str, Any]) -> None:
    """Fill ``figures["imports"]`` and ``figures["operator"]``: per revision label, one dict per run."""
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
            for tree in trees:
                operator[tree.label].append(measure_operator(tree, cluster.kubeconfig, n, logs))
                ready = operator[tree.label][-1]["ready_s"]
                log(f"operator run {n + 1}/{operator_runs} {tree.label}: ready {ready:.2f} s")


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
        measure(trees, args.runs, args.operator_runs, run.figures)
        labels = [tree.label for tree in trees]
        run.figures["medians"] = mid = medians(run.figures["imports"], run.figures["operator"])
        print(f"## {HEADING}\n")
        print(f"Medians of {args.runs} import and {args.operator_runs} operator runs each, alternating.\n")
        print(table(labels, mid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
