"""The operator's CPU per Stack without the node (issue 44, row 3 of "Beside the Go operator"): N
Program Stacks applied at once, until all are Ready, on a control plane of its own, for git revisions
side by side and optionally under a profiler.

    .venv/bin/python hack/bench/operatorcpu.py                                   # HEAD, 20 Stacks, once
    .venv/bin/python hack/bench/operatorcpu.py --compare HEAD~3 --runs 3         # a revision, then HEAD
    .venv/bin/python hack/bench/operatorcpu.py --rev . --profile /tmp/op.html    # the working tree, profiled
    .venv/bin/python hack/bench/operatorcpu.py --engine real --stacks 20         # the real Pulumi engine

Each run starts a fresh control plane (etcd, kube-apiserver, kube-controller-manager: its StatefulSet
controller makes the workspace pods), the play-kubelet (pko.devtools.playkubelet), which runs each
workspace pod's real agent as a process with the stand-in Pulumi CLI (pko.devtools.standin; ``--engine
real``: the real engine of hack/build-pulumi.sh), and the operator as a process (``python -m pko``
under its ServiceAccount and the shipped RBAC, the flags of hack/bench/deploy.py), from the revision's
own tree (``git worktree``, as hack/bench/startup.py checks revisions out; ``.`` is the working tree).
Once its caches have synced, N Programs and N Stacks naming them are applied (10 at a time, as
``kubectl apply`` would), and the run ends when every Stack is Ready. The figure: the operator
process's CPU seconds (user + system, from /proc; the agents, the apiserver and this script are other
processes) from just before the first apply to all Ready, divided by N; beside it the wall time, and
the reconciles each controller ran in that window (its ``/metrics``).

Revisions alternate run by run (A B, B A, A B, ...), so a drift in the machine's load falls on both;
the table gives medians. ``--profile PATH`` runs every revision's last run under pyinstrument
(installed into ``~/.cache/pko/pyinstrument-<version>`` on first use and put on that process's
``PYTHONPATH`` only: never a project dependency), sampling only the window above (started and stopped
by SIGUSR1/SIGUSR2); ``.html`` writes pyinstrument's page, ``.json`` speedscope's format, anything
else its text; with several revisions each gets its own file (``-<label>`` before the suffix). The
profiled run's CPU is not in the medians. It also prints the profile's heaviest functions by own time.
``--json PATH`` writes every run and the record of the run (pko.devtools.benchrecord).
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
import urllib.request
from pathlib import Path
from typing import Any

from common import REPO, api_client
from deploy import (
    NAMESPACE,
    OPERATOR_USER,
    PROGRAM_BODY,
    caches_synced,
    operator_command,
    start_harness,
)
from driver import bounded, cpu_seconds, exit_on_sigterm, free_port, log, stop_and_keep_log
from startup import RUN_OPERATOR, Tree, checked_out

from pko.controllers.resources import PROGRAMS, STACKS
from pko.devtools.benchrecord import recording
from pko.devtools.localcluster import LocalCluster
from pko.devtools.realpulumi import make_real_pulumi
from pko.devtools.standin import make_fake_pulumi
from pko.machinery.conditions import get_condition
from pko.machinery.resource import ResourceClient

PYINSTRUMENT = "5.1.3"
PYINSTRUMENT_DIR = Path.home() / ".cache/pko" / f"pyinstrument-{PYINSTRUMENT}"
# The stand-in CLI's program: a resource whose outputs are its inputs, and a secret output.
STANDIN_PROGRAM: dict[str, Any] = {
    "resources": {"settings": {"type": "test:index:Echo", "properties": {"greeting": "hello"}}},
    "outputs": {"greeting": "${settings.greeting}", "token": {"fn::secret": "${settings.greeting}"}},
}
# Run in the profiled operator before anything else: SIGUSR1 starts pyinstrument, SIGUSR2 stops it
# and writes the session (then rendered by this script, which needs no pyinstrument of its own). It
# samples by the event loop thread's CPU time: on 2 cores shared with the agents and the apiserver a
# wall-clock profile is mostly time spent waiting for a core.
PROFILE_BOOT = """\
import signal as _signal
import time as _time
import pyinstrument as _pyinstrument
from pyinstrument.stack_sampler import get_stack_sampler as _sampler
_profiler = _pyinstrument.Profiler(interval=0.001, async_mode="disabled")
def _start(*_):
    _sampler().timer_func = _time.thread_time  # the main thread's CPU time, not the wall clock
    _profiler.start()
def _stop(*_):
    _profiler.stop()
    _profiler.last_session.save({session!r})
_signal.signal(_signal.SIGUSR1, _start)
_signal.signal(_signal.SIGUSR2, _stop)
"""
# Every request of the operator's ServiceAccount, metadata only (the others' are not logged).
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}"]
- level: None
"""
RECONCILES = re.compile(
    r'^controller_runtime_reconcile_total\{controller="([^"]+)",result="([^"]+)"\} (\S+)$'
)


def ensure_pyinstrument() -> Path:
    if not (PYINSTRUMENT_DIR / "pyinstrument").is_dir():
        log(f"installing pyinstrument {PYINSTRUMENT} into {PYINSTRUMENT_DIR}")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(PYINSTRUMENT_DIR),
             f"pyinstrument=={PYINSTRUMENT}"],
            check=True,
        )  # fmt: skip
    return PYINSTRUMENT_DIR


def requests(audit: Path, start: int, end: int) -> dict[str, int]:
    """The operator's requests logged between two offsets of the audit log, by ``verb
    resource[/subresource]`` (each once: a watch is logged when it starts and when it ends)."""
    with audit.open("rb") as f:
        f.seek(start)
        data = f.read(end - start)
    seen: set[str] = set()
    out: dict[str, int] = {}
    for line in data.splitlines():
        event = json.loads(line)
        if event.get("auditID") in seen:
            continue
        seen.add(event.get("auditID"))
        ref = event.get("objectRef") or {}
        what = ref.get("resource", event.get("requestURI", "?").split("?")[0])
        what += f"/{ref['subresource']}" if ref.get("subresource") else ""
        dry = " (dry run)" if "dryRun=" in str(event.get("requestURI")) else ""
        key = f"{event.get('verb')} {what}{dry}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def audit_offset(audit: Path) -> int:
    """The end of the last complete line of the audit log."""
    if not audit.exists():
        return 0
    data = audit.read_bytes()
    return data.rfind(b"\n") + 1


def reconciles(metrics_port: int) -> dict[str, float]:
    """controller_runtime_reconcile_total per controller (every result summed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if m := RECONCILES.match(line):
            out[m[1]] = out.get(m[1], 0.0) + float(m[3])
    return out


async def apply_stack(api: Any, i: int, body: dict[str, Any]) -> None:
    name = f"app-{i:04d}"
    program = {"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name}, "program": body}
    stack = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": {"stack": f"dev-{i}", "programRef": {"name": name}},
    }
    await ResourceClient(api, PROGRAMS, NAMESPACE).apply(program, field_manager="kubectl")
    await ResourceClient(api, STACKS, NAMESPACE).apply(stack, field_manager="kubectl")


async def all_ready(api: Any, n: int, within: float, proc: subprocess.Popen[bytes]) -> None:
    stacks = ResourceClient(api, STACKS, NAMESPACE)
    deadline = time.monotonic() + within
    while True:
        listing = await stacks.list()
        ready = 0
        for obj in listing.items:
            cond = get_condition((obj.get("status") or {}).get("conditions"), "Ready")
            ready += bool(cond and cond.get("status") == "True")
        if ready >= n:
            return
        if proc.poll() is not None:
            raise RuntimeError("the operator exited; see .bench-logs/operatorcpu-operator.log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n - ready} of {n} Stacks not Ready after {within:.0f} s")
        await asyncio.sleep(0.5)


async def one_run(
    cluster: LocalCluster, tmp: Path, tree: Tree, args: argparse.Namespace, session: Path | None
) -> dict[str, Any]:
    api = await api_client(str(cluster.kubeconfig))
    async with api:
        subprocess.run(  # noqa: ASYNC221 - a one-off set-up step
            ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side", "-f",
             str(tree.path / "config/crd/bases")],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        real = args.engine == "real"  # pulumi-kubernetes makes the ConfigMap as the pod's account
        engine = make_real_pulumi if real else make_fake_pulumi
        op, kubelet = await start_harness(api, cluster, tmp, engine, programs_role=real)
        health, metrics = free_port(), free_port()
        cmd = operator_command(op, free_port(), metrics, health)
        boot = tree.boot() + (PROFILE_BOOT.format(session=str(session)) if session else "")
        cmd = [sys.executable, "-c", boot + RUN_OPERATOR, *cmd[3:], "--metrics-secure=false"]  # from the tree
        pythonpath = [str(tree.path)] + ([str(ensure_pyinstrument())] if session else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
        logf = open(tmp / "operator.log", "w")  # noqa: ASYNC230 - opened once, written by the child
        proc = subprocess.Popen(cmd, cwd=tree.path, env=env, stdout=logf, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        body = PROGRAM_BODY if args.engine == "real" else STANDIN_PROGRAM
        try:
            await caches_synced(health, proc)
            await asyncio.sleep(1.0)  # start-up settles (the first list's reconciles: there is nothing)
            before = reconciles(metrics)
            if session:
                proc.send_signal(signal.SIGUSR1)
            offset = audit_offset(tmp / "audit.log")
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            await bounded(args.stacks, 10, lambda i: apply_stack(api, i, body))
            await all_ready(api, args.stacks, args.timeout, proc)
            wall, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
            if session:
                proc.send_signal(signal.SIGUSR2)
            after = reconciles(metrics)
            await asyncio.sleep(2.0)  # the audit log is written in batches
            made = requests(tmp / "audit.log", offset, audit_offset(tmp / "audit.log"))
            if session:
                for _ in range(600):
                    if await asyncio.to_thread(session.exists):
                        break
                    await asyncio.sleep(0.1)
        finally:
            stop_and_keep_log(proc, tmp / "operator.log", "operatorcpu-operator.log")
            logf.close()
            await kubelet.stop()
            if op.api is not None:
                await op.api.close()
    return {
        "rev": tree.rev,
        "commit": tree.commit,
        "stacks": args.stacks,
        "profiled": session is not None,
        "wall_s": wall,
        "operator_cpu_s": cpu,
        "operator_cpu_per_stack_s": cpu / args.stacks,
        "reconciles": {k: after[k] - before.get(k, 0.0) for k in sorted(after)},
        "requests": made,
    }


def run_once(tree: Tree, args: argparse.Namespace, session: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pko-opcpu-") as name:
        tmp = Path(name)
        policy = tmp / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        audit = [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={tmp / 'audit.log'}",
            "--audit-log-format=json",
        ]
        cluster = LocalCluster(tmp / "cluster", extra_apiserver_args=audit)
        cluster.start()
        try:
            return asyncio.run(one_run(cluster, tmp, tree, args, session))
        finally:
            cluster.stop()


def render(session: Path, out: Path) -> list[tuple[str, float, int]]:
    """Write the session as ``out`` asks (by suffix) and return the heaviest functions by own time
    (function, seconds, samples' share in per mille of the whole)."""
    script = f"""
import json
from pyinstrument.session import Session
from pyinstrument import renderers
s = Session.load({str(session)!r})
suffix = {out.suffix!r}
if suffix == '.html':
    text = renderers.HTMLRenderer().render(s)
elif suffix == '.json':  # frames under 0.2 % of the whole left out: a page-sized file
    text = renderers.SpeedscopeRenderer(processor_options={{'filter_threshold': 0.002}}).render(s)
else:
    options = {{'filter_threshold': 0.01}}
    text = renderers.ConsoleRenderer(unicode=True, color=False, processor_options=options).render(s)
open({str(out)!r}, 'w').write(text)
own = {{}}
def walk(frame):
    if frame is None:
        return
    key = frame.function + ' ' + (frame.file_path_short or '') + ':' + str(frame.line_no or '')
    own[key] = own.get(key, 0.0) + frame.total_self_time
    for child in frame.children:
        walk(child)
walk(s.root_frame())
top = sorted(own.items(), key=lambda kv: -kv[1])[:40]
print(json.dumps([[k, v] for k, v in top] + [["__total__", s.root_frame().time]]))
"""
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(PYINSTRUMENT_DIR)}  # pyinstrument, never a dependency
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"rendering {session} failed:\n{done.stderr}")
    rows = json.loads(done.stdout)
    total = rows.pop()[1] or 1.0
    return [(k, v, round(1000 * v / total)) for k, v in rows]


def profile_path(base: Path, label: str, several: bool) -> Path:
    if not several:
        return base
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
    return base.with_name(f"{base.stem}-{safe}{base.suffix}")


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stacks", type=int, default=20)
    p.add_argument("--runs", type=int, default=1, help="runs per revision, alternating (default 1)")
    p.add_argument("--compare", action="append", default=[], help="a revision measured before --rev")
    p.add_argument("--rev", default="HEAD", help="the revision measured last ('.': the working tree)")
    p.add_argument("--engine", choices=["standin", "real"], default="standin")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for all Ready")
    p.add_argument("--profile", type=Path, help="one more run per revision under pyinstrument, written here")
    p.add_argument("--json", type=Path, help="write every run and the run's record here")
    args = p.parse_args()
    revs = [*args.compare, args.rev]
    with recording("hack/bench/operatorcpu.py", args.json, vars(args)) as record:
        with (
            tempfile.TemporaryDirectory(prefix="pko-opcpu-trees-") as base,
            trees_for(revs, Path(base)) as trees,
        ):
            runs: dict[str, list[dict[str, Any]]] = {t.label: [] for t in trees}
            for n in range(args.runs):
                for tree in trees if n % 2 == 0 else list(reversed(trees)):
                    log(f"run {n + 1}/{args.runs}: {tree.label}, {args.stacks} Stacks")
                    result = run_once(tree, args, None)
                    per, wall = result["operator_cpu_per_stack_s"], result["wall_s"]
                    log(f"  {per:.3f} CPU s per Stack, {wall:.1f} s")
                    runs[tree.label].append(result)
            profiles: dict[str, Any] = {}
            if args.profile:
                ensure_pyinstrument()
                for tree in trees:
                    (REPO / ".bench-logs").mkdir(exist_ok=True)
                    session = REPO / ".bench-logs" / f"operatorcpu-{tree.commit[:12]}.pyisession"
                    session.unlink(missing_ok=True)
                    log(f"profiled run: {tree.label}")
                    result = run_once(tree, args, session)
                    out = profile_path(args.profile, tree.rev, len(trees) > 1)
                    top = render(session, out)
                    profiles[tree.label] = {"file": str(out), "run": result, "top_own_time": top}
        record.figures.update({"runs": runs, "profiles": profiles})
        print_tables(args, runs, profiles)
    return 0


@contextlib.contextmanager
def trees_for(revs: list[str], base: Path) -> Any:
    """The revisions' trees (``.``: this checkout as it is, uncommitted changes included)."""
    committed = [r for r in revs if r != "."]
    with checked_out(committed, base) as trees:
        by_rev = {t.rev: t for t in trees}
        yield [by_rev[r] if r != "." else Tree(".", "worktree", REPO) for r in revs]


def print_tables(
    args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], profiles: dict[str, Any]
) -> None:
    labels = list(runs)
    print(f"## Operator CPU per Stack: {args.stacks} Program Stacks at once -> all Ready "
          f"({args.engine} engine)\n")  # fmt: skip
    print("| revision | runs | CPU s per Stack, median | min - max | wall s, median | reconciles per Stack |")
    print("|---|---:|---:|---|---:|---|")
    medians: dict[str, float] = {}
    for label in labels:
        rows = runs[label]
        if not rows:
            continue
        per = [r["operator_cpu_per_stack_s"] for r in rows]
        medians[label] = statistics.median(per)
        rec: dict[str, list[float]] = {}
        for r in rows:
            for k, v in r["reconciles"].items():
                rec.setdefault(k, []).append(v / args.stacks)
        recs = ", ".join(
            f"{k.removesuffix('-controller')} {statistics.median(v):.1f}" for k, v in sorted(rec.items())
        )
        print(f"| {label} | {len(rows)} | {medians[label]:.3f} | {min(per):.3f} - {max(per):.3f} | "
              f"{statistics.median(r['wall_s'] for r in rows):.1f} | {recs} |")  # fmt: skip
    keys = sorted({k for rows in runs.values() for r in rows for k in r.get("requests", {})})
    if keys:
        print("\nThe operator's API requests per Stack (medians; from the apiserver's audit log, the window "
              "above and 2 s after):\n")  # fmt: skip
        print("| request | " + " | ".join(labels) + " |")
        print("|---|" + "---:|" * len(labels))
        for key in [*keys, "all"]:
            cells = []
            for label in labels:
                counts = [
                    sum(r["requests"].values()) if key == "all" else r["requests"].get(key, 0)
                    for r in runs[label]
                ]
                cells.append(f"{statistics.median(counts) / args.stacks:.2f}" if counts else "-")
            print(f"| {key} | " + " | ".join(cells) + " |")
    if len(medians) > 1:
        last = labels[-1]
        print()
        for label in labels[:-1]:
            print(f"{last} / {label}: {medians[last] / medians[label]:.2f}")
    for label, prof in profiles.items():
        run = prof["run"]
        print(f"\n## Profile of {label}: {run['operator_cpu_per_stack_s']:.3f} CPU s per Stack under the "
              f"profiler, {prof['file']}\n")  # fmt: skip
        print("| function (own time) | s | per mille |")
        print("|---|---:|---:|")
        for name, seconds, share in prof["top_own_time"][:25]:
            print(f"| `{name}` | {seconds:.2f} | {share} |")


if __name__ == "__main__":
    sys.exit(main())
