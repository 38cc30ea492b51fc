"""The load cell: N Stacks updating at once, a probe Stack changed meanwhile (its Update must start
within seconds: no worker is held by a running update), the operator killed -9 in the middle, and
every one of the N + 1 judged as a cell."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from pko.devtools.chaos import report
from pko.devtools.chaos.cells import (
    Cell,
    cleanup,
    passphrase,
    prepare_namespace,
    prepare_s3,
    program,
    stack,
    volume,
)
from pko.devtools.chaos.faults import fault_operator_kill9
from pko.devtools.chaos.judge import UpdateLog, _now, _ready_for, judge, witness
from pko.devtools.chaos.kube import TRANSIENT, apply, patch
from pko.devtools.chaos.rounds import healthy_control_plane
from pko.devtools.waiting import until


@dataclass
class Load:
    """The load cell: ``stacks`` Stacks updating at once (each ``3 x step_seconds``), a probe Stack
    changed meanwhile (how long until its Update starts: no worker may be held by a running update),
    and the operator killed (-9) in the middle; then every one of them judged as a cell is."""

    stacks: int
    backend: str
    probe_start_seconds: float | None = None
    recovery_seconds: float | None = None
    cells: list[Cell] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return "pass" if self.cells and all(c.outcome == "pass" for c in self.cells) else "FAIL"


# The load cell's workspace pods ask for this much CPU (the default, 100m, as the Go operator's, fits
# about 17 pods on the node's 2 cores): their commands sleep; the engines share what the node has.
LOAD_CPU = "20m"


def run_load(load: Load, step_seconds: int, bound: float, run_id: str) -> Load:
    probe, names = f"probe-{run_id}", [f"load{i}-{run_id}" for i in range(load.stacks)]
    for name in [probe, *names]:
        for obj in volume(name, "witness") + (volume(name, "state") if load.backend == "file" else []):
            apply(obj)
        apply(passphrase(name))
    apply(program(probe, 1))
    log = UpdateLog()
    with log.running():
        apply(stack(probe, load.backend, "1"))
        until("probe Ready", lambda: _ready_for(probe, 1), within=bound, interval=1.0, transient=TRANSIENT)
        started = _now()
        for name in names:
            apply(program(name, step_seconds))
            apply(stack(name, load.backend, "1", cpu=LOAD_CPU))
        until(
            f"{load.stacks} updates running",
            lambda: all("create step1 1" in witness(n) for n in names),
            within=bound,
            interval=2,
            transient=TRANSIENT,
        )
        t_change = time.monotonic()
        patch("stack", probe, {"spec": {"config": {"gen": "2"}}})
        until(
            "probe's Update created",
            lambda: log.of(probe, "up", started),
            within=120,
            interval=0.2,
            transient=TRANSIENT,
        )
        load.probe_start_seconds = round(time.monotonic() - t_change, 1)
        fault_operator_kill9(probe)
        t0 = time.monotonic()
        everyone = [(probe, "2"), *((n, "1") for n in names)]
        try:
            until(
                "all Ready",
                lambda: all(_ready_for(n, 2 if n == probe else 1) for n, _ in everyone),
                within=bound,
                interval=5,
                transient=TRANSIENT,
            )
            load.recovery_seconds = round(time.monotonic() - t0, 1)
        except TimeoutError as e:
            load.cells.append(Cell("operator-kill9", "load", load.backend, "FAIL", detail=str(e)))
        time.sleep(2)
    for name, gen in everyone:
        cell = Cell("operator-kill9", "up-change" if name == probe else "up", load.backend)
        judge(cell, name, log, started, "up", gen)
        cell.outcome = "pass" if not cell.problems else "FAIL"
        cell.detail = f"{name}: " + "; ".join(cell.problems) if cell.problems else ""
        load.cells.append(cell)
    return load


def load_cell(stacks: int, backend: str, step_seconds: int, bound: float, out: Path | None) -> Load:
    prepare_namespace()
    if backend == "s3":
        prepare_s3()
    run_id, load = secrets.token_hex(2), Load(stacks, backend)
    healthy_control_plane()
    try:
        run_load(load, step_seconds, bound, run_id)
    except Exception as e:
        load.cells.append(Cell("operator-kill9", "load", backend, "FAIL", detail=f"{type(e).__name__}: {e}"))
    finally:
        for name in [f"probe-{run_id}", *(f"load{i}-{run_id}" for i in range(stacks))]:
            cleanup(name)
    if out:
        report.save(out, load)
    return load
