"""What a run says: the cells as a table (every cell, with what failed), as the grid
docs/fault-matrix.md shows, and as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pko.devtools.chaos.cells import Cell
from pko.devtools.chaos.kube import OPERATIONS


def save(out: Path, cells: Any) -> None:
    """``cells`` (a list of cells, or the load cell) as JSON at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    data = [asdict(c) for c in cells] if isinstance(cells, list) else asdict(cells)
    out.write_text(json.dumps(data, indent=1))


def table(matrix: list[Cell]) -> str:
    rows = ["| fault | operation | backend | outcome | recovery s | detail |", "|---|---|---|---|---:|---|"]
    for c in matrix:
        secs = "" if c.recovery_seconds is None else f"{c.recovery_seconds:.1f}"
        rows.append(f"| {c.fault} | {c.operation} | {c.backend} | {c.outcome} | {secs} | {c.detail[:200]} |")
    return "\n".join(rows)


def grid(matrix: list[Cell]) -> str:
    """The matrix as docs/fault-matrix.md shows it: a row per fault, a column per operation and backend, each
    cell the seconds from the fault to recovery (or what else it ended as)."""
    columns = sorted({(c.operation, c.backend) for c in matrix}, key=lambda k: (OPERATIONS.index(k[0]), k[1]))
    faults = list(dict.fromkeys(c.fault for c in matrix))
    by = {(c.fault, c.operation, c.backend): c for c in matrix}

    def said(c: Cell | None) -> str:
        if c is None:
            return ""
        if c.outcome == "pass" and c.recovery_seconds is not None:
            return f"{c.recovery_seconds:.0f}"
        if c.outcome == "pass" and c.reported_seconds is not None:
            return f"stalled {c.reported_seconds:.0f}"
        return c.outcome

    head = "| fault | " + " | ".join(f"{o} {b}" for o, b in columns) + " |"
    rows = [head, "|---|" + "---:|" * len(columns)]
    for f in faults:
        rows.append(f"| {f} | " + " | ".join(said(by.get((f, o, b))) for o, b in columns) + " |")
    return "\n".join(rows)
