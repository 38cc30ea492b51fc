"""A round: every cell of one fault at once, each on a clean Stack of its own, the fault landing while
their operations are in flight; and the matrix run round by round."""

from __future__ import annotations

import secrets
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pko.devtools.chaos import report
from pko.devtools.chaos.cells import (
    RETRY_CAP,
    SPARE,
    Cell,
    cell_name,
    cleanup,
    passphrase,
    prepare_namespace,
    prepare_s3,
    program,
    stack,
    volume,
)
from pko.devtools.chaos.faults import (
    CLUSTER_FAULTS,
    EFFECT,
    FAULTS,
    NOT_APPLICABLE,
    NOT_RUN,
    OUT_OF_SERVICE,
    REDUCED,
    SLOW_EFFECT,
    _reports_node_loss,
    snapshot,
    spare_node,
)
from pko.devtools.chaos.judge import UpdateLog, _now, _ready_for, judge, witness
from pko.devtools.chaos.kube import (
    NAMESPACE,
    OPERATOR,
    OPERATOR_NS,
    TRANSIENT,
    VOLUMES,
    apply,
    condition,
    get,
    kubectl,
    patch,
)
from pko.devtools.waiting import until


@dataclass
class Trial:
    """One cell's Stack in a round: what it runs, and what the judge expects of it."""

    cell: Cell
    name: str
    expected_type: str = "up"
    gen: str = "1"
    token: str | None = None
    started: str = ""
    before: dict[str, Any] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return self.cell.operation


def each(
    what: str,
    trials: list[Trial],
    probe: Callable[[Trial], bool],
    within: float,
    interval: float = 1.0,
    since: float | None = None,
    strict: bool = True,
) -> dict[str, float]:
    """Polls ``probe`` on every trial until it has held for each: the seconds each took (from
    ``since``, a ``time.monotonic()``, else from the call), by name. Past ``within``: TimeoutError
    naming the ones missing, or (not ``strict``) the ones that got there."""
    t0, done = since if since is not None else time.monotonic(), {}
    deadline = time.monotonic() + within
    while True:
        for t in trials:
            if t.name in done:
                continue
            try:
                if probe(t):
                    done[t.name] = round(time.monotonic() - t0, 1)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
                pass  # the apiserver restarting, an object not there yet: ask again
        if len(done) == len(trials):
            return done
        if time.monotonic() > deadline:
            if not strict:
                return done
            missing = [t.name for t in trials if t.name not in done]
            raise TimeoutError(f"{what}: not within {within:.0f}s for {', '.join(missing)}")
        time.sleep(interval)


def _in_flight(t: Trial, log: UpdateLog) -> bool:
    """The cell's operation has started and not ended: the fault lands in the middle of it."""
    lines = witness(t.name)
    if t.op in ("up", "up-change"):
        return f"create step1 {t.gen}" in lines and f"create step3 {t.gen}" not in lines
    if t.op == "destroy":
        return "delete step3" in lines and "delete step1" not in lines
    return any(condition(u, "Complete").get("status") != "True" for u in log.of(t.name, "refresh", t.started))


def _at_once(fault: Callable[[str], None], names: list[str]) -> None:
    """The fault done to every cell's workspace at the same moment (some take seconds: a 30 s cut)."""
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            fault(name)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def run_round(round_: list[Cell], step_seconds: int, bound: float, run_id: str) -> list[Cell]:
    """Every cell of one fault at once, each on a clean Stack of its own. Their operations are brought
    in flight together (first ups, the slowest to start, go first; a refresh, which takes seconds,
    last), then the fault lands: once, for the faults of the whole cluster, or on every cell's
    workspace at the same moment for the others. Each cell is then judged alone."""
    fault = round_[0].fault
    fixing, lost = fault == "cause-fixed", fault == "node-lost"
    trials = [Trial(c, cell_name(c, run_id)) for c in round_]
    for t in trials:
        # node-lost: a file state is on the lost node's disk (its pod can run nowhere else); the
        # witness stays readable, as an observer outside the cluster would be.
        state = volume(t.name, "state", SPARE.name if lost else None) if t.cell.backend == "file" else []
        for obj in volume(t.name, "witness") + state:
            apply(obj)
        apply(passphrase(t.name))
        if not fixing:
            (VOLUMES / t.name / "witness" / "fixed").touch()
        apply(program(t.name, step_seconds * SLOW_EFFECT.get(fault, 1), guarded=fixing))

    def deploy(t: Trial) -> None:
        t.started = _now()
        disk = "512Mi" if fault == "disk-full" else None
        apply(stack(t.name, t.cell.backend, "1", disk, retries=fixing, spare=lost))

    ups = [t for t in trials if t.op == "up"]
    later = [t for t in trials if t.op in ("up-change", "destroy")]
    refreshes = [t for t in trials if t.op == "refresh"]
    log = UpdateLog()
    with log.running():
        for t in later + refreshes:
            deploy(t)
        each("first up Ready", later + refreshes, lambda t: _ready_for(t.name, 1), bound, 2)
        for t in ups:
            deploy(t)
        each("up started", ups, lambda t: bool(log.of(t.name, "up", t.started)), bound, 0.5)
        for t in later:
            t.started = _now()
            if t.op == "up-change":
                t.gen = "2"
                patch("stack", t.name, {"spec": {"config": {"gen": "2"}}})
            else:
                t.expected_type = "destroy"
                kubectl("-n", NAMESPACE, "delete", "stack", t.name, "--wait=false")
        if fixing:
            # Failed and backed off to the cap: the 3rd retry waits the full 30 s.
            def failed(t: Trial) -> bool:
                failures = [u for u in log.of(t.name, "up") if condition(u, "Failed").get("status") == "True"]
                return len(failures) >= 3

            each("three failed ups", trials, failed, bound, 2)
        else:
            marker = {"up": "create step1 {}", "up-change": "create step1 {}", "destroy": "delete step3"}
            each(
                "mid operation",
                ups + later,
                lambda t: marker[t.op].format(t.gen) in witness(t.name),
                bound,
                0.5,
            )
        for t in trials:  # before the refreshes start: they take seconds
            t.before = snapshot(t.name)
        for t in refreshes:
            t.started, t.expected_type, t.token = _now(), "refresh", f"chaos-{time.time_ns()}"
            annotation = f"pulumi.com/refresh-request={t.token}"
            kubectl("-n", NAMESPACE, "annotate", "--overwrite", "stack", t.name, annotation)
        each("refresh running", refreshes, lambda t: bool(log.of(t.name, "refresh", t.started)), bound, 0.2)
        for t in trials:
            if not fixing and not _in_flight(t, log):
                t.cell.problems.append("the operation was not in flight when the fault came")
            where = (get("pod", f"{t.name}-workspace-0") or {}).get("spec", {}).get("nodeName")
            if lost and where != SPARE.name:
                t.cell.problems.append(f"the workspace pod ran on {where}, not on {SPARE.name}")
        # The fault runs beside the watch for recovery: some last (a leader frozen 85 s, a 30 s cut),
        # and what recovers meanwhile (a standby taking over) counts from the fault's start.
        t0, struck = time.monotonic(), []

        def strike() -> None:
            try:
                if fault in CLUSTER_FAULTS:
                    FAULTS[fault](trials[0].name)
                else:
                    _at_once(FAULTS[fault], [t.name for t in trials])
            except Exception as e:
                struck.append(e)

        striking = threading.Thread(target=strike)
        striking.start()

        def recovered(t: Trial) -> bool:
            if fault in SLOW_EFFECT and striking.is_alive():
                return False  # the fault has not taken effect yet
            if t.op == "destroy":
                return get("stack", t.name) is None
            generation = int((get("stack", t.name) or {})["metadata"]["generation"])
            return _ready_for(t.name, generation, t.token)

        recovering = trials
        if lost:
            # Kubernetes never replaces a pod its node may still run: the Stack must say what a person
            # decides (the node is gone: out of service). With the state on that node, nothing can
            # recover: the cell ends there; with S3, the person acts and the Stack must recover.
            reported = each(
                "node loss reported",
                trials,
                lambda t: _reports_node_loss(t.name),
                bound,
                2,
                since=t0,
                strict=False,
            )
            for t in trials:
                t.cell.reported_seconds = reported.get(t.name)
                if t.cell.reported_seconds is None:
                    said = condition(get("stack", t.name), "Stalled").get("message")
                    t.cell.problems.append(f"the Stack never said {SPARE.name} was lost (Stalled: {said})")
            recovering = [t for t in trials if t.cell.backend != "file"]
            if recovering:
                kubectl("taint", "nodes", SPARE.name, OUT_OF_SERVICE, "--overwrite")
        left = max(0.0, bound - (time.monotonic() - t0))
        times = each("recovered", recovering, recovered, left, 2, since=t0, strict=False)
        striking.join()
        if struck:
            raise struck[0]
        time.sleep(2)  # the poller's last look
        log.catch_up()
        limit = RETRY_CAP + 3 * step_seconds + 20  # the cap, the up itself, the pod's start
        for t in recovering:
            t.cell.recovery_seconds = times.get(t.name)
            if t.cell.recovery_seconds is None:
                t.cell.problems.append(f"not recovered within {bound:.0f}s of the fault")
                for c in ((get("stack", t.name) or {}).get("status") or {}).get("conditions") or []:
                    said = f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:300]}"
                    t.cell.problems.append(said)
            elif fixing and t.cell.recovery_seconds > limit:
                t.cell.problems.append(
                    f"the fix was picked up after {t.cell.recovery_seconds} s (bound {limit} s)"
                )
            effect = EFFECT.get(fault)
            if effect and t.op != "destroy" and snapshot(t.name)[effect] == t.before[effect]:
                t.cell.problems.append(
                    f"the fault did not take effect ({effect} unchanged: {t.before[effect]})"
                )
    for t in trials:
        stranded = t not in recovering
        judge(t.cell, t.name, log, t.started, t.expected_type, t.gen, stranded=stranded)
        t.cell.outcome = "pass" if not t.cell.problems else "FAIL"
        t.cell.detail = "; ".join(t.cell.problems)
        if lost and not t.cell.problems:
            t.cell.detail = f"Stalled naming {SPARE.name} after {t.cell.reported_seconds} s" + (
                "; the state was on that node: no recovery (nothing ran twice)"
                if stranded
                else "; out-of-service taint put on then, recovered on the other node"
            )
    return round_


def healthy_control_plane(within: float = 180) -> None:
    """Before a cell: every component up, the operator Deployment available (a fault may leave a
    restart still settling)."""
    until(
        "apiserver",
        lambda: kubectl("get", "--raw", "/readyz", check=False).strip() == "ok",
        within=within,
        interval=1.0,
        transient=TRANSIENT,
    )
    rollout = ("rollout", "status", f"deployment/{OPERATOR}", f"--timeout={int(within)}s")
    kubectl("-n", OPERATOR_NS, *rollout, timeout=within + 20)


@contextmanager
def replicas(n: int) -> Iterator[None]:
    """The operator with ``n`` replicas (leader election picks one), back to what it was after."""
    before = int((get("deployment", OPERATOR, OPERATOR_NS) or {}).get("spec", {}).get("replicas") or 1)
    kubectl("-n", OPERATOR_NS, "scale", f"deployment/{OPERATOR}", f"--replicas={n}")
    healthy_control_plane()
    try:
        yield
    finally:
        kubectl("-n", OPERATOR_NS, "scale", f"deployment/{OPERATOR}", f"--replicas={before}")


def cells(faults: list[str], operations: list[str], backends: list[str], reduced: bool) -> list[Cell]:
    if reduced:
        return [Cell(f, o, b) for f, o, b in REDUCED if f in faults and o in operations and b in backends]
    return [Cell(f, o, b) for f in faults for o in operations for b in backends]


def rounds(matrix: list[Cell], serial: bool = False) -> list[list[Cell]]:
    """The cells to run, a round per fault (every operation and backend at once), or a round per cell
    (``serial``); the cells not run get their outcome here."""
    by_fault: dict[str, list[Cell]] = {}
    for cell in matrix:
        if cell.fault in NOT_RUN:
            cell.detail = NOT_RUN[cell.fault]
        elif (cell.fault, cell.operation) in NOT_APPLICABLE:
            cell.outcome, cell.detail = "n/a", "a fix ends a failing up"
        else:
            by_fault.setdefault(cell.fault if not serial else str(id(cell)), []).append(cell)
    return list(by_fault.values())


def run(
    matrix: list[Cell], step_seconds: int, bound: float, out: Path | None = None, serial: bool = False
) -> list[Cell]:
    prepare_namespace()
    if any(c.backend == "s3" for c in matrix):
        prepare_s3()
    run_id = secrets.token_hex(2)
    for round_ in rounds(matrix, serial):
        healthy_control_plane()
        fault = round_[0].fault
        said = ", ".join(f"{c.operation} ({c.backend})" for c in round_)
        print(f"chaos: {fault} during {said} ...", file=sys.stderr, flush=True)
        try:
            with (
                replicas(2)
                if fault == "leader-lost"
                else spare_node()
                if fault == "node-lost"
                else nullcontext()
            ):
                run_round(round_, step_seconds, bound, run_id)
        except Exception as e:  # a round that could not even be set up fails its cells, not the run
            traceback.print_exc()
            for cell in round_:
                if cell.outcome == "not run":
                    cell.outcome, cell.detail = "FAIL", f"{type(e).__name__}: {e}"
        finally:
            try:
                _at_once(cleanup, [cell_name(c, run_id) for c in round_])
            except Exception:
                traceback.print_exc()  # the next round's names are its own: go on
        for c in round_:
            print(
                f"chaos:   {c.operation} ({c.backend}): {c.outcome} {c.recovery_seconds}s {c.detail}",
                file=sys.stderr,
                flush=True,
            )
        if out:
            report.save(out, matrix)
    return matrix
