"""``python3 -m pko.devtools.chaos`` (``hack/chaos.py``): the fault matrix, or the load cell."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pko.devtools.chaos as package
from pko.devtools.chaos.faults import FAULTS, NOT_RUN
from pko.devtools.chaos.kube import BACKENDS, OPERATIONS, REPO
from pko.devtools.chaos.load import load_cell
from pko.devtools.chaos.report import grid, table
from pko.devtools.chaos.rounds import cells, run
from pko.devtools.localnode.processes import _pids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hack/chaos.py", description=(package.__doc__ or "").split("\n\n")[0])
    p.add_argument("--faults", default=",".join([*FAULTS, *NOT_RUN]))
    p.add_argument("--operations", default=",".join(OPERATIONS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--reduced", action="store_true", help="only the cells .ci/run runs")
    p.add_argument(
        "--serial", action="store_true", help="one cell at a time (default: a fault's cells at once)"
    )
    p.add_argument("--step-seconds", type=int, default=15, help="each command's sleep (three in a chain)")
    p.add_argument("--bound", type=float, default=600, help="seconds a cell may take to recover")
    p.add_argument("--json", type=Path, default=REPO / ".bench-logs" / "chaos.json")
    p.add_argument(
        "--load",
        type=int,
        metavar="N",
        help="instead of the matrix: N Stacks updating at once (--step-seconds each step), a probe Stack "
        "changed meanwhile, the operator killed; on the first of --backends",
    )
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("chaos: needs root (it signals the node's processes and edits iptables)")
    if not _pids():
        raise SystemExit("chaos: no node is running: hack/up.sh first")
    unknown = set(args.faults.split(",")) - set(FAULTS) - set(NOT_RUN)
    if unknown:
        raise SystemExit(f"chaos: unknown faults {sorted(unknown)}; known: {', '.join([*FAULTS, *NOT_RUN])}")
    if args.load:
        load = load_cell(args.load, args.backends.split(",")[0], args.step_seconds, args.bound, args.json)
        print(table(load.cells))
        print(
            f"load: {load.stacks} Stacks + the probe: {load.outcome}; the probe's Update started "
            f"{load.probe_start_seconds} s after its change; "
            f"all Ready {load.recovery_seconds} s after the kill"
        )
        return 0 if load.outcome == "pass" else 1
    matrix = cells(args.faults.split(","), args.operations.split(","), args.backends.split(","), args.reduced)
    run(matrix, args.step_seconds, args.bound, args.json, args.serial)
    print(table(matrix))
    print()
    print(grid(matrix))
    return 0 if all(c.outcome != "FAIL" for c in matrix) else 1


if __name__ == "__main__":
    sys.exit(main())
