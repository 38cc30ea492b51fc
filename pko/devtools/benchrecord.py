"""The raw JSON a benchmark writes beside its printed tables (``--json PATH`` of hack/bench's scripts): the
record of the run (when, at which commit, on what machine, under what load, with which command) and
every figure it printed, so a figure quoted in docs/benchmarks.md can be traced to its run.

One source of truth: a script prints its tables from the figures it measured, inside :func:`recording`,
which keeps what was printed; the JSON holds each printed table's rows as printed (``tables``, keyed by
the heading above the table), the printed text itself, and the measured values the tables were
formatted from (``figures``), so a figure printed is exactly a figure recorded.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[2]

# --- the record: a figure means little without when, on what and under what load it was measured ------
# The machine is shared, so the load average at start and end is part of the result.


def cpu_model(cpuinfo: str) -> str:
    """The CPU's name from ``/proc/cpuinfo`` text (x86's ``model name``; else ``Processor`` or
    ``cpu model``, as some ARM and MIPS kernels write it); empty if none is given."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Processor", "cpu model") and value.strip():
            return value.strip()
    return ""


def dirty_paths(porcelain: str) -> list[str]:
    """Tracked paths with uncommitted changes, from ``git status --porcelain=v1`` output (untracked
    files excluded by the caller); a rename lists its new path."""
    return [line[3:].split(" -> ")[-1] for line in porcelain.splitlines() if len(line) > 3]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""


def start_record(benchmark: str, argv: list[str] | None = None) -> dict[str, Any]:
    """What to write beside a run's figures, taken as it starts: the UTC date, the git commit and the
    tracked files changed from it (the tree the run measured), the machine and its load average."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    dirty = dirty_paths(_git("status", "--porcelain=v1", "--untracked-files=no"))
    return {
        "benchmark": benchmark,
        "command": [Path(sys.executable).name, *(sys.argv if argv is None else argv)],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD").strip(),
        "dirty": bool(dirty),
        "dirty_paths": dirty,
        "machine": {
            "nproc": os.cpu_count() or 0,
            "cpu": cpu_model(cpuinfo) or platform.processor(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "loadavg_start": list(os.getloadavg()),  # 1, 5 and 15 minutes
    }


def finish_record(record: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The record with the load average at the end and the run's figures, ready to write."""
    return {**record, "loadavg_end": list(os.getloadavg()), **figures}


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plain(record), indent=2, allow_nan=False) + "\n")


def plain(value: Any) -> Any:
    """``value`` as strict JSON has it: a set or tuple as a list, a path as a string, an infinite or NaN
    float as the string Python prints for it (``inf``: a bench's "not within the time"), which JSON has
    no number for."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(item) for item in value]
    return value


# --- the printed tables, read back -----------------------------------------------------------------


def table_rows(markdown: str) -> list[dict[str, str]]:
    """The rows of every Markdown table in ``markdown`` as {header: cell}, so the raw JSON holds each
    figure exactly as it was printed; a header printed twice in one table names its second column
    ``<header> (2)`` (and so on), so no cell is lost."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in markdown.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            header = None
            continue
        cells = [c.strip() for c in line[1:-1].split("|")]
        if header is None:
            header = _unique(cells)
        elif not all(set(c) <= set(":-") and c for c in cells):  # not the |---|:-:| line
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


def _unique(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        n = sum(1 for earlier in names[: len(out)] if earlier == name) + 1
        out.append(name if n == 1 else f"{name} ({n})")
    return out


def tables_by_heading(markdown: str) -> dict[str, list[dict[str, str]]]:
    """The rows of the tables under each Markdown heading (``#`` to ``######``), keyed by the heading's
    text; a heading with no table is left out, tables before any heading are under ``""``. A heading
    printed twice keeps the rows of both."""
    tables: dict[str, list[dict[str, str]]] = {}
    heading = ""
    body: list[str] = []
    for line in [*markdown.splitlines(), "# "]:
        marks, _, text = line.partition(" ")
        if marks and set(marks) == {"#"} and len(marks) <= 6:
            rows = table_rows("\n".join(body))
            if rows:
                tables.setdefault(heading, []).extend(rows)
            heading, body = text.strip(), []
        else:
            body.append(line)
    return tables


class Tee(io.StringIO):
    """Stdout that is also kept, so the JSON holds exactly the tables that were printed."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        return super().write(text)

    def flush(self) -> None:
        self.out.flush()


# --- one run, recorded -----------------------------------------------------------------------------


@dataclass
class Recording:
    """A run being recorded: the script adds the values its tables are printed from to ``figures``
    (JSON-able: numbers, strings, lists and dicts of them)."""

    record: dict[str, Any]
    printed: Tee
    figures: dict[str, Any] = field(default_factory=dict)

    def document(self, failed: str | None = None) -> dict[str, Any]:
        """What the JSON holds: the record, every printed table's rows (``tables``), the figures
        (beside them, as run.py's and policy.py's always were), the printed text."""
        text = self.printed.getvalue()
        clash = set(self.figures) & {*self.record, "loadavg_end", "tables", "printed", "failed"}
        if clash:
            raise ValueError(f"figures named as the record's own keys: {sorted(clash)}")
        extra = {"failed": failed} if failed else {}
        return finish_record(
            self.record, {"tables": tables_by_heading(text), **self.figures, "printed": text, **extra}
        )


@contextlib.contextmanager
def recording(
    benchmark: str, path: Path | None, args: dict[str, Any] | None = None, argv: list[str] | None = None
) -> Iterator[Recording]:
    """Keep what the block prints (it still reaches stdout) and, with a ``path``, write the run's JSON
    there when it ends, with ``args`` (the options parsed, defaults included) beside the command line.
    A run that fails after measuring something is written too, with ``failed`` saying why, so hours of
    figures are not lost to an error in what comes after them."""
    record = start_record(benchmark, argv)
    if args is not None:
        record["args"] = args
    run = Recording(record, Tee(sys.stdout))
    try:
        with contextlib.redirect_stdout(run.printed):
            yield run
    except BaseException as exc:
        if path is not None and run.figures:
            write_record(path, run.document(failed=f"{type(exc).__name__}: {exc}"))
            print(f"bench: the figures so far, with the failure: {path}", file=sys.stderr)
        raise
    if path is not None:
        write_record(path, run.document())
        print(f"bench: raw figures and the run's record: {path}", file=sys.stderr)
