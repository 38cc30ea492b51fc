"""peerscale.py's results as a table: one row per figure, the Go operator's and pko's side by side."""

from __future__ import annotations

import argparse
from typing import Any

Obj = dict[str, Any]


def fmt_row(row: Obj) -> str:
    return ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())


def cell(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def ratio_value(go: Any, pko: Any) -> float | None:
    """pko / Go, None unless both are numbers measured and Go's is neither 0 nor infinite."""
    if not isinstance(go, float) or not isinstance(pko, float) or go in (0.0, float("inf")) or go != go:
        return None
    return pko / go


def shown_ratio(value: float | None, compared: bool = True) -> str:
    if not compared:
        return ""
    return "-" if value is None else f"{value:.2f}"


# (label, key, digits, compared): the table's rows; {n}, {idle}, {timeout}, {shape} filled in.
BACKGROUND_FIGURES = [
    ("idle background, no Stacks: API requests/min, all clients ({background} s)", "background_min", 0, True),
    ("idle background: operator CPU, % of one core", "background_cpu_pct", 2, True),
]
ROW3_FIGURES = [
    ("{n} Program Stacks applied at once -> all Ready, s (inf: not within {timeout} s)", "wall", 1, True),
    ("operator CPU per Stack, s", "cpu_per_stack", 3, True),
    (
        "API requests per Stack (all clients, less the bench's own and the background)",
        "requests_per_stack",
        1,
        True,
    ),
    ("API writes per Stack (the same)", "writes_per_stack", 1, True),
    (
        "API requests per Stack on the Pulumi kinds (the operator's alone)",
        "pulumi_requests_per_stack",
        1,
        True,
    ),
    ("API writes per Stack on the Pulumi kinds", "pulumi_writes_per_stack", 1, True),
    ("operator peak RSS, MB (1 s samples)", "peak_rss_mb", 0, True),
    ("operator CPU throttled by its limit, s", "throttled", 1, True),
    ("operator container restarts (0 is right)", "restarts", 0, False),
]
IDLE_FIGURES = [
    ("{n} idle Stacks ({shape}): operator scaled up -> every Stack has a status, s", "first_pass", 1, True),
    ("{n} idle: of which until the new pod held the leader Lease, s", "lease", 1, True),
    ("{n} idle: operator CPU, start-up and first pass, s", "cpu_first_pass", 1, True),
    ("{n} idle: writes to the Pulumi kinds per Stack, first pass", "pulumi_writes_first_pass", 2, True),
    ("{n} idle: operator RSS after the first pass, MB", "rss_mb", 0, True),
    ("{n} idle: operator CPU over the {idle} s idle window, s", "cpu_idle", 1, True),
    ("{n} idle: the same, % of one core", "cpu_idle_pct", 2, True),
    ("{n} idle: API requests/min, idle (all clients, less the background)", "requests_min", 0, True),
    (
        "{n} idle: API requests/min on the Pulumi kinds, idle (the operator's alone)",
        "pulumi_requests_min",
        0,
        True,
    ),
    ("{n} idle: API writes/min on the Pulumi kinds, idle", "pulumi_writes_min", 0, True),
    ("{n} idle: operator CPU throttled by its limit, idle window, s", "throttled", 1, True),
    ("{n} idle: Workspaces in the namespace (0 is right)", "workspaces", 0, False),
    ("{n} idle: operator container restarts (0 is right)", "restarts", 0, False),
    ("{n} idle: creating the Stacks (the operator scaled to 0; the bench's time), s", "created", 1, False),
]


def figure_rows(results: dict[str, Obj], args: argparse.Namespace) -> list[Obj]:
    """The table's rows: each figure's label, the Go operator's and pko's value, pko / Go (None where
    the figure is not compared or either value is missing), and the digits it is printed with."""
    go, pko = results.get("go") or {}, results.get("pko") or {}
    out: list[Obj] = []

    def rows(figures: list[tuple[str, str, int, bool]], prefix: str, **fill: Any) -> None:
        for label, key, digits, compared in figures:
            g, p = go.get(prefix + key), pko.get(prefix + key)
            value = ratio_value(g, p) if compared else None
            out.append(
                {"figure": label.format(**fill), "go": g, "pko": p, "ratio": value, "digits": digits,
                 "compared": compared}
            )  # fmt: skip

    rows(BACKGROUND_FIGURES, "", background=f"{args.background_seconds:.0f}")
    if args.stacks:
        rows(ROW3_FIGURES, "row3.", n=args.stacks, timeout=f"{args.timeout:.0f}")
    for n in args.idle:
        rows(IDLE_FIGURES, f"idle{n}.", n=f"{n:,}", shape=args.idle_shape, idle=f"{args.idle_seconds:.0f}")
    return out


def print_table(rows: list[Obj]) -> None:
    """figure_rows() as a Markdown table."""
    print("# pko beside the Go operator v2.9.0 with many Stacks, local node (one run)\n")
    print("| figure | Go operator | pko | pko / Go |")
    print("|---|---:|---:|---:|")
    for row in rows:
        shown = shown_ratio(row["ratio"], row["compared"])
        digits = row["digits"]
        print(f"| {row['figure']} | {cell(row['go'], digits)} | {cell(row['pko'], digits)} | {shown} |")
