"""The record written beside a benchmark's raw JSON (hack/bench/common.py) and run.py's reading of its own
printed tables: a figure in docs/data/ is only as good as the date, commit and machine beside it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "bench"))

from common import REPO, cpu_model, dirty_paths, finish_record, start_record, table_rows, write_record
from run import tables_by_heading

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
