"""The judge of a cell: what ran (the witness log), what the state backend holds, every Update seen
(a watch), and the verdict: one successful Update of the intended type, every command once, no lock,
no pending operation, the program's resources (see the package's docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pko.devtools.chaos.cells import Cell
from pko.devtools.chaos.kube import BUCKET, FILER, NAMESPACE, STEPS, VOLUMES, condition, get, items, kubectl
from pko.devtools.localnode.node import STATE, bin_dir


def witness(name: str) -> list[str]:
    try:
        return (VOLUMES / name / "witness" / "log").read_text().splitlines()
    except OSError:
        return []


def _filer(path: str) -> str:
    return kubectl(
        "-n", "default", "exec", "deployment/seaweedfs", "-c", "seaweedfs", "--",
        "wget", "-q", "-O", "-", "--header", "Accept: application/json", FILER + path,
        check=False,
    )  # fmt: skip


def backend_state(name: str, backend: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The stack's checkpoint (None: no stack in the backend) and the locks held on it."""
    stacks, locks = f".pulumi/stacks/{name}/dev.json", f".pulumi/locks/{name}/dev"
    if backend == "file":
        root = VOLUMES / name / "state"
        checkpoint = root / stacks
        held = sorted(p.name for p in (root / locks).glob("*")) if (root / locks).is_dir() else []
        return (json.loads(checkpoint.read_text()) if checkpoint.exists() else None), held
    text = _filer(f"/buckets/{BUCKET}/{stacks}")
    listing = _filer(f"/buckets/{BUCKET}/{locks}/")
    try:
        entries = json.loads(listing).get("Entries") or [] if listing.strip() else []
    except ValueError:
        entries = []
    try:
        state = json.loads(text) if text.strip() else None
    except ValueError:
        state = None
    return state, sorted(e["FullPath"].rsplit("/", 1)[-1] for e in entries)


@dataclass
class UpdateLog:
    """Every Update seen in the namespace while a cell ran, from a watch (a poll can miss an Update
    that completes and is garbage collected with its deleted Stack within a second)."""

    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _proc: subprocess.Popen[str] | None = None

    def watch(self) -> None:
        """``kubectl get --watch`` (restarted when the apiserver drops it), its JSON objects decoded
        as they stream."""
        decoder = json.JSONDecoder()
        while not self._stop.is_set():
            env = {**os.environ, "KUBECONFIG": str(STATE / "kubeconfig")}
            command = [
                str(bin_dir() / "kubectl"),
                "get",
                "updates",
                "-n",
                NAMESPACE,
                "--watch",
                "-o",
                "json",
            ]
            self._proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
            )
            assert self._proc.stdout is not None
            buffer = ""
            for line in self._proc.stdout:
                buffer += line
                try:
                    obj, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    continue
                buffer = buffer.lstrip()[end:]
                for u in obj.get("items") or [obj]:
                    if u.get("kind") == "Update":
                        self.seen[u["metadata"]["name"]] = u
            self._proc.wait()
            self._stop.wait(1.0)

    @contextmanager
    def running(self) -> Iterator[UpdateLog]:
        thread = threading.Thread(target=self.watch, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            if self._proc is not None:
                self._proc.terminate()
            thread.join(10)

    def catch_up(self) -> None:
        """Add what a list shows now: a watch restarted while the apiserver was away can miss
        Updates (seen after an apiserver restart: a second up the watch never showed)."""
        for u in items("updates"):
            self.seen.setdefault(u["metadata"]["name"], u)
            if condition(u, "Complete").get("status") == "True":
                self.seen[u["metadata"]["name"]] = u

    def of(self, stack: str, type_: str, since: str = "") -> list[dict[str, Any]]:
        return [
            u
            for u in self.seen.values()
            if (u["metadata"].get("labels") or {}).get("pulumi.com/stack-name") == stack
            and (u.get("spec") or {}).get("type") == type_
            and u["metadata"]["creationTimestamp"] >= since
        ]

    def succeeded(self, stack: str, type_: str, since: str) -> list[str]:
        return sorted(
            u["metadata"]["name"]
            for u in self.of(stack, type_, since)
            if condition(u, "Complete").get("status") == "True"
            and condition(u, "Failed").get("status") != "True"
        )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _ready_for(name: str, generation: int, refresh_token: str | None = None) -> bool:
    s = get("stack", name)
    if s is None:
        return False
    c = condition(s, "Ready")
    status = s.get("status") or {}
    last = status.get("lastUpdate") or {}
    if refresh_token is not None and status.get("observedRefreshRequest") != refresh_token:
        return False
    return (
        c.get("status") == "True"
        and last.get("state") == "succeeded"
        and int(last.get("generation") or 0) >= generation
        and int(s["metadata"]["generation"]) == generation
    )


def judge(
    cell: Cell, name: str, log: UpdateLog, since: str, expected_type: str, gen: str, stranded: bool = False
) -> None:
    """The cell's verdict (see the module's docstring). ``stranded``: the state went with a lost node,
    so only one rule holds: nothing ran twice."""
    if stranded:
        lines = witness(name)
        for line in set(lines):
            if lines.count(line) > 1:
                cell.problems.append(f"{line!r} ran {lines.count(line)} times")
        return
    ok = log.succeeded(name, expected_type, since)
    if len(ok) != 1:
        cell.problems.append(f"{len(ok)} successful {expected_type} Updates ({', '.join(ok) or 'none'})")
    lines = witness(name)
    if cell.operation in ("up", "up-change"):
        for step in STEPS:
            n = lines.count(f"create {step} {gen}")
            if n != 1:
                cell.problems.append(f"{step} created {n} times for gen {gen}")
    elif cell.operation == "destroy":
        for step in STEPS:
            n = lines.count(f"delete {step}")
            if n != 1:
                cell.problems.append(f"{step} deleted {n} times")
    elif any(line.startswith("delete") for line in lines) or len(lines) != len(STEPS):
        cell.problems.append(f"the refresh ran commands: {lines}")
    state, locks = backend_state(name, cell.backend)
    if locks:
        cell.problems.append(f"locks left in the state: {locks}")
    latest = ((state or {}).get("checkpoint") or {}).get("latest") or {}
    pending = [p.get("resource", {}).get("urn") for p in latest.get("pending_operations") or []]
    if pending:
        cell.problems.append(f"pending operations left: {pending}")
    commands = sorted(
        r["urn"].rsplit("::", 1)[-1]
        for r in latest.get("resources") or []
        if r["type"] == "command:local:Command"
    )
    want = [] if cell.operation == "destroy" else sorted(STEPS)
    if state is None and cell.operation != "destroy":
        cell.problems.append("no checkpoint in the backend")
    elif commands != want:
        cell.problems.append(f"resources in the state {commands}, the program has {want}")
