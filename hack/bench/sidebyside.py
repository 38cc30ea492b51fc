"""Issue 26's six rows in one run: pko beside the Go Pulumi Kubernetes Operator (v2.9.0, built by
hack/build-peer.sh) on the local node, each operator installed from its own manifests, measured and
removed with its CRDs before the other (Go first), pko left installed at the end (without the sample).

    hack/up.sh
    .venv/bin/python hack/bench/sidebyside.py                       # the issue's table: ~70 min on 2 cores
    .venv/bin/python hack/bench/sidebyside.py --stacks 10 --idle 100 --idle-seconds 30   # smoke run

For each operator in turn, peer.py's rows (1 first deploy, 2 a config change beside the bare
`pulumi up`, 5 the workspace pod replaced, 6 the operator pod deleted mid-update) and then
peerscale.py's (3 ``--stacks`` Program Stacks at once, 4 ``--idle`` idle Stacks over an
``--idle-seconds`` window); how each figure is taken is in those two files' docstrings. Prints the
six-row summary, then each bench's full table, all from this one run; ``--json PATH`` writes them with
the run's record (pko.devtools.benchrecord), each row with both operators' values and pko / Go, and
every figure behind them (peer.py's per round, peerscale.py's per operator).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import peer
import peerscale
import peerscale_busy
import peerscale_table
from common import api_client
from driver import exit_on_sigterm, log
from node import KUBECONFIG

from pko.controllers.resources import STACKS
from pko.devtools.benchrecord import recording
from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]


async def bench(args: argparse.Namespace, peer_dist: Path) -> tuple[peer.Results, dict[str, Obj]]:
    go, pko = peer.operators(peer_dist)
    peer.clear_node(pko)
    small: peer.Results = {}
    scale: dict[str, Obj] = {}
    api = await api_client(str(KUBECONFIG))
    async with api:
        client = ResourceClient(api, STACKS, peer.NS)
        try:
            for op in (go, pko):
                log(op.label)
                op.install()
                try:
                    small[op.label] = await peer.measure(op, args.updates, args.restarts)
                    scale[op.label] = await peerscale.measure(op, client, args)
                finally:
                    op.remove()
        finally:
            pko.install()
    return small, scale


# (figure, Go, pko, digits); the counts of row 6 ("1 is right") have no ratio
Row = tuple[str, Any, Any, int]


def summary_rows(small: peer.Results, scale: dict[str, Obj], args: argparse.Namespace) -> list[Row]:
    """The issue's six rows, each as (figure, Go, pko): the headline of each row, in the issue's order."""

    def both(key: str) -> tuple[Any, Any]:
        return scale["go"].get(key), scale["pko"].get(key)

    def med(key: str) -> tuple[float, float]:
        return peer.median(small, "go", key), peer.median(small, "pko", key)

    rows: list[Row] = [
        ("1. Program Stack applied -> Ready, s", *med("first"), 1),
        ("2. config change -> Ready, s", *med("update"), 1),
        ("2. the bare `pulumi up` in the same pod, s", *med("bare"), 1),
        ("2. operator overhead per update, s", peer.overhead(small, "go"), peer.overhead(small, "pko"), 1),
    ]
    if args.stacks:
        n = args.stacks
        rows += [
            (f"3. {n} Program Stacks at once -> all Ready, s", *both("row3.wall"), 1),
            ("3. operator CPU per Stack, s", *both("row3.cpu_per_stack"), 3),
            ("3. API requests per Stack", *both("row3.requests_per_stack"), 1),
            ("3. API writes per Stack", *both("row3.writes_per_stack"), 1),
            ("3. operator peak RSS, MB", *both("row3.peak_rss_mb"), 0),
        ]
    for n in args.idle:
        rows += [
            (f"4. {n:,} idle Stacks: first pass, s", *both(f"idle{n}.first_pass"), 1),
            (f"4. {n:,} idle: operator RSS, MB", *both(f"idle{n}.rss_mb"), 0),
            (f"4. {n:,} idle: operator CPU, % of a core", *both(f"idle{n}.cpu_idle_pct"), 2),
            (f"4. {n:,} idle: API requests/min", *both(f"idle{n}.requests_min"), 0),
        ]
    rows += [
        ("5. workspace pod deleted -> Workspace Ready again, s", *med("restart"), 1),
        ("6. operator pod deleted mid-update -> Stack Ready, s", *med("operator_restart"), 1),
        ("6. Updates that change made (1 is right)", *med("updates_made"), 0),
        ("6. engine runs recorded (1 is right)", *med("engine_runs"), 0),
    ]
    return rows


def summary_table(rows: list[Row]) -> list[Obj]:
    """The summary's rows as the JSON records them and the table prints them: the figure, the Go
    operator's and pko's value, pko / Go (None where there is none: a count, a value missing), and the
    digits it is printed with."""
    out: list[Obj] = []
    for label, g, p, digits in rows:
        value = None if "1 is right" in label else peerscale_table.ratio_value(g, p)
        out.append({"row": label, "go": g, "pko": p, "ratio": value, "digits": digits})
    return out


def print_summary(rows: list[Obj]) -> None:
    print("| row | Go operator | pko | pko / Go |")
    print("|---|---:|---:|---:|")
    for row in rows:
        shown = peerscale_table.shown_ratio(row["ratio"], "1 is right" not in row["row"])
        digits = row["digits"]
        cells = f"{peerscale_table.cell(row['go'], digits)} | {peerscale_table.cell(row['pko'], digits)}"
        print(f"| {row['row']} | {cells} | {shown} |")


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=2, help="rows 2: config changes")
    p.add_argument("--restarts", type=int, default=2, help="row 5: workspace pod deletions")
    peerscale.add_arguments(p)
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = peerscale.parse(p)
    if not KUBECONFIG.exists():
        print("bench: no local node; run hack/up.sh first", file=sys.stderr)
        return 2
    if args.stacks:
        peerscale_busy.disk_check(args.stacks, args.disk_per_workspace_gb)
    with recording("hack/bench/sidebyside.py", args.json, vars(args)) as run:
        small, scale = asyncio.run(bench(args, peer.build_peer()))
        run.figures.update(
            summary=summary_table(summary_rows(small, scale, args)),
            peer_rows=peer.figure_rows(small),
            peerscale_rows=peerscale_table.figure_rows(scale, args),
            peer_rounds=small,
            peerscale_operators=scale,
        )
        print_tables(run.figures, args)
    return 0


def print_tables(figures: Obj, args: argparse.Namespace) -> None:
    """The run's tables, from the figures measured (the same dict the JSON records)."""
    print("# pko beside the Go operator v2.9.0, local node: issue 26's six rows (one run)\n")
    print_summary(figures["summary"])
    window, recovery = f"{args.idle_seconds:.0f} s", f"{peer.RECOVERY:.0f} s"
    print(f"\nRow 4's idle window: {window}; row 6's inf: not Ready within {recovery}.")
    print("\n## Rows 1, 2, 5 and 6 in full (peer.py's table)\n")
    peer.print_table(figures["peer_rows"])
    print()
    peerscale_table.print_table(figures["peerscale_rows"])


if __name__ == "__main__":
    sys.exit(main())
