"""The record written beside a benchmark's raw JSON (pko.devtools.benchrecord) and the reading of its own
printed tables: a figure in docs/data/ is only as good as the date, commit and machine beside it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pko.devtools.benchrecord import (
    REPO,
    cpu_model,
    dirty_paths,
    finish_record,
    plain,
    recording,
    start_record,
    table_rows,
    tables_by_heading,
    write_record,
)

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
"""

ARM_CPUINFO = """Processor\t: AArch64 Processor rev 4 (aarch64)
processor\t: 0
BogoMIPS\t: 38.40
"""


def test_cpu_model_reads_x86_and_older_arm_kernels_and_is_empty_when_absent() -> None:
    assert cpu_model(X86_CPUINFO) == "Intel(R) Xeon(R) Processor"
    assert cpu_model(ARM_CPUINFO) == "AArch64 Processor rev 4 (aarch64)"
    assert cpu_model("processor\t: 0\nBogoMIPS\t: 50.00\nmodel name\t:\n") == ""


def test_dirty_paths_lists_changed_tracked_files_and_a_renames_new_name() -> None:
    porcelain = " M hack/bench/run.py\nM  docs/benchmarks.md\n D old.py\nR  a.py -> b.py\n"
    assert dirty_paths(porcelain) == ["hack/bench/run.py", "docs/benchmarks.md", "old.py", "b.py"]
    assert dirty_paths("") == []


def test_record_names_this_checkouts_commit_the_machine_and_the_load_at_both_ends(tmp_path: Path) -> None:
    record = start_record("hack/bench/example.py", ["--rounds", "1"])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert record["commit"] == head.strip()
    assert record["dirty"] == bool(record["dirty_paths"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", record["date"])
    assert record["command"][1:] == ["--rounds", "1"]
    assert record["machine"]["nproc"] == os.cpu_count()
    assert len(record["loadavg_start"]) == 3

    path = tmp_path / "data" / "bench.json"
    write_record(path, finish_record(record, {"seconds": [1.5, 2.0]}))
    written = json.loads(path.read_text())
    assert written["seconds"] == [1.5, 2.0]
    assert len(written["loadavg_end"]) == 3
    assert written["commit"] == record["commit"]


PRINTED = """# pko machinery benchmarks (issue 4)

machine: 2 CPUs, load average at start 2.50; python 3.11.7

## Workqueue: add/get/done cycles per second, in-process (target >= 300k/s)

| case | workqueue cycles/s | asyncio.Queue cycles/s (anchor) | ratio | >= 300k/s |
|---|---:|---:|---:|:-:|
| batch | 2,434,724 | 2,163,278 | 1.13 | yes |
| workers | 1,512,532 | 1,691,327 | 0.89 | yes |

## Informer cold sync: 20 Stack-shaped objects (4.8 KB each as served, 2.7 KB as cached)

| contender | sync s | target < 150 MB: delta / after |
|---|---:|:-:|
| bare kubernetes-asyncio list, kept (anchor) (20) | 0.04 |  |
| pko informer (default transform) (20) | 0.03 | yes / yes |

apiserver flags added: none; load average at end 3.10
"""


def test_every_printed_table_row_is_kept_under_its_heading_with_cells_as_printed() -> None:
    tables = tables_by_heading(PRINTED)
    assert list(tables) == [
        "Workqueue: add/get/done cycles per second, in-process (target >= 300k/s)",
        "Informer cold sync: 20 Stack-shaped objects (4.8 KB each as served, 2.7 KB as cached)",
    ]
    workqueue, informer = tables.values()
    assert workqueue[1] == {
        "case": "workers",
        "workqueue cycles/s": "1,512,532",
        "asyncio.Queue cycles/s (anchor)": "1,691,327",
        "ratio": "0.89",
        ">= 300k/s": "yes",
    }
    assert [row["target < 150 MB: delta / after"] for row in informer] == ["", "yes / yes"]
    assert table_rows("no table here\n") == []


def test_tables_before_any_heading_and_under_a_top_heading_are_kept_and_a_repeated_heading_keeps_both() -> (
    None
):
    printed = (
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "# The run\n\nprose\n\n| figure | s |\n|---|---:|\n| wall | 3.0 |\n"
        "## Writes\n\n| verb | n |\n|---|---:|\n| create | 1 |\n"
        "## Writes\n\n| verb | n |\n|---|---:|\n| patch | 2 |\n"
        "### Empty\n\nno table\n"
    )
    assert tables_by_heading(printed) == {
        "": [{"a": "1", "b": "2"}],
        "The run": [{"figure": "wall", "s": "3.0"}],
        "Writes": [{"verb": "create", "n": "1"}, {"verb": "patch", "n": "2"}],
    }


def test_what_json_has_no_word_for_is_written_as_the_nearest_thing_it_has(tmp_path: Path) -> None:
    assert plain({"t": (1, 2.5), "s": {3}, "inf": float("inf"), "p": tmp_path, "n": None}) == {
        "t": [1, 2.5],
        "s": [3],
        "inf": "inf",
        "p": str(tmp_path),
        "n": None,
    }
    path = tmp_path / "r.json"
    write_record(path, {"recovered": [float("inf"), 12.5]})
    assert json.loads(path.read_text()) == {"recovered": ["inf", 12.5]}  # strict JSON: no Infinity


def test_a_recording_writes_the_record_every_printed_table_and_the_figures_they_were_printed_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.json"
    with recording("hack/bench/example.py", path, {"stacks": 2}, ["--stacks", "2"]) as run:
        run.figures["wall_s"] = 12.345
        print("## Apply to Ready\n\n| figure | s |\n|---|---:|")
        print(f"| wall time | {run.figures['wall_s']:.1f} |")
    printed = capsys.readouterr().out
    assert "| wall time | 12.3 |" in printed  # printed as ever
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "hack/bench/example.py" and doc["command"][1:] == ["--stacks", "2"]
    assert doc["args"] == {"stacks": 2}
    assert {"date", "commit", "machine", "loadavg_start", "loadavg_end"} <= set(doc)
    assert doc["tables"] == {"Apply to Ready": [{"figure": "wall time", "s": "12.3"}]}
    assert doc["wall_s"] == 12.345 and doc["printed"] == printed
    assert "failed" not in doc


def test_a_failed_recording_keeps_what_it_measured_and_says_why_and_one_with_nothing_writes_nothing(
    tmp_path: Path,
) -> None:
    measured, empty = tmp_path / "measured.json", tmp_path / "empty.json"
    with pytest.raises(RuntimeError), recording("hack/bench/example.py", measured, argv=[]) as run:
        run.figures["rounds"] = [1.0, 2.0]
        raise RuntimeError("the table could not be printed")
    doc = json.loads(measured.read_text())
    assert doc["rounds"] == [1.0, 2.0]
    assert doc["failed"] == "RuntimeError: the table could not be printed"
    with pytest.raises(RuntimeError), recording("hack/bench/example.py", empty, argv=[]):
        raise RuntimeError("before any figure")
    assert not empty.exists()


def test_a_figure_named_as_a_key_of_the_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="commit"), recording("x", tmp_path / "x.json", argv=[]) as run:
        run.figures["commit"] = "mine"
