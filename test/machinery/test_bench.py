"""The benchmark commands run end to end at tiny sizes, print their tables and write them with the run's
record to ``--json`` (no timing asserted): every table row printed is in the JSON as printed, and the
figures the docs quote are among them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def printed_rows(stdout: str) -> list[list[str]]:
    """The cells of every table body row in ``stdout``, read here on their own (not with the recorder's
    parser): a row is a ``|``-line after a table's ``|---|`` line."""
    rows: list[list[str]] = []
    in_table = False
    for line in stdout.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            in_table = False
            continue
        cells = [c.strip() for c in line[1:-1].split("|")]
        if all(c and set(c) <= set("-:") for c in cells):
            in_table = True
        elif in_table:
            rows.append(cells)
    return rows


def recorded(stdout: str, path: Path, benchmark: str) -> dict[str, Any]:
    """The JSON the run wrote, checked to hold the run's record and every table row it printed."""
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["benchmark"] == benchmark
    assert doc["command"][1] == str(REPO / benchmark) and doc["command"][-2:] == ["--json", str(path)]
    assert len(doc["commit"]) == 40 and doc["date"].endswith("+00:00")
    assert doc["machine"]["nproc"] == os.cpu_count() and doc["machine"]["kernel"]
    assert "cpu" in doc["machine"] and len(doc["loadavg_start"]) == len(doc["loadavg_end"]) == 3
    assert "failed" not in doc
    assert doc["printed"] and set(doc["printed"].splitlines()) <= set(stdout.splitlines())
    kept = [list(row.values()) for rows in doc["tables"].values() for row in rows]
    shown = printed_rows(stdout)
    assert shown, "no table printed"
    missing = [row for row in shown if row not in kept]
    assert not missing, f"printed but not in the JSON: {missing}"
    assert len(kept) == len(shown)
    return doc


def figure(doc: dict[str, Any], heading: str, name: str, column: str = "figure") -> dict[str, str]:
    """The row of the table under ``heading`` whose ``column`` starts with ``name``."""
    rows = [r for r in doc["tables"][heading] if r[column].startswith(name)]
    assert rows, f"no {name!r} under {heading!r}: {doc['tables'][heading]}"
    return rows[0]


def run(command: list[str], timeout: float, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.cluster
@pytest.mark.slow
def test_bench_command_prints_and_records_every_table_at_tiny_sizes(tmp_path: Path) -> None:
    path = tmp_path / "machinery.json"
    table = run(
        [str(REPO / "hack/bench/run.py"), "--sizes", "20", "--stacks", "20", "--contenders", "bare,ours",
         "--wq-rounds", "2", "--json", str(path)],
        600,
    )  # fmt: skip
    assert "## Workqueue" in table and "| batch |" in table
    assert "| 20 | bare kubernetes-asyncio loop (anchor) |" in table
    assert "| 20 | pko machinery (Manager, 25 workers) |" in table
    assert "| pko informer (default transform) (20) |" in table
    doc = recorded(table, path, "hack/bench/run.py")
    fanout = "Fan-out: time from operator start until every object has a status (25 workers)"
    ours = figure(doc, fanout, "pko machinery", column="contender")
    assert ours["N"] == "20" and ours["PATCH requests"] == "20"
    assert [r["contender"] for r in doc["fanout_runs"]] == ["bare", "ours"] * 3
    assert [m["mode"] for m in doc["informer_runs"]] == ["bare", "ours", "ours-raw"]


@pytest.mark.cluster
@pytest.mark.slow
def test_steady_state_bench_prints_and_records_its_figures_at_tiny_size(tmp_path: Path) -> None:
    path = tmp_path / "steady.json"
    table = run(
        [str(REPO / "hack/bench/steady.py"), "--stacks", "50", "--duration", "10", "--quiet", "5",
         "--buckets", "5", "--teams", "5", "--resync", "60", "--json", str(path)],
        600,
    )  # fmt: skip
    assert "Ready pods" in table
    assert "resync spread:" in table
    assert "Secrets/ConfigMaps cached: no" in table
    doc = recorded(table, path, "hack/bench/steady.py")
    after = "The operator after its first pass"
    for name in (
        "operator RSS at end (MB)",
        "operator RSS peak in window (MB)",
        "operator CPU % of one core over the window",
        "first pass: operator start to every Stack reconciled (s)",
        "first pass: operator start to its last write (s)",
        "git requests in the first pass / in the window",
        "first pass: slowest /healthz answer (s)",
        "first pass: slowest /metrics answer (s)",
        "first pass: largest event-loop heartbeat age (s)",
    ):
        figure(doc, after, name)
    assert figure(doc, after, "operator RSS at end")["value"] == f"{doc['operator_rss_end_mb']:.0f}"
    assert figure(doc, after, "operator CPU %")["value"] == f"{doc['operator_cpu_pct']:.1f}"
    git = f"{doc['git_requests_first_pass']} / {doc['git_requests_window']}"
    assert figure(doc, after, "git requests")["value"] == git
    buckets = doc["tables"]["Reconciles per bucket of the window"]
    assert [b["reconciles"] for b in buckets] == [f"{b['reconciles']:.0f}" for b in doc["buckets"]]
    assert len(buckets) == 5
    assert doc["seeded"]["stacks"] == 50 and doc["secrets_configmaps_cached"] == []
    assert any("stacks" in i["resource"] for i in doc["informers"])
    for heading in (
        "API writes in the first pass (only the operator writes then)",
        "API writes in the window",
    ):
        assert doc["tables"][heading][-1]["verb"] == "all"
    assert doc["args"]["stacks"] == 50 and doc["args"]["resync"] == 60


@pytest.mark.cluster
@pytest.mark.slow
def test_deploy_bench_prints_and_records_writes_per_stack_and_the_floor_at_tiny_size(tmp_path: Path) -> None:
    path = tmp_path / "deploy.json"
    table = run(
        [str(REPO / "hack/bench/deploy.py"), "--stacks", "2", "--timeout", "300", "--agent-runs", "1",
         "--json", str(path)],
        900,
        PYTHONPATH=str(REPO / "test"),  # the play-kubelet and the real engine's fixture (deploy.py says)
    )  # fmt: skip
    doc = recorded(table, path, "hack/bench/deploy.py")
    writes = doc["tables"]["Writes per deployed Stack"]
    assert {"verb resource": "create updates", "writes": "1", "per Stack": "1.0"} in writes  # one Update
    assert doc["one_stack"]["writes"]["create updates"] == 1
    many = "2 Stacks from apply to Ready"
    for name in (
        "wall time, apply to all Ready (s)",
        "the floor:",
        "operator / floor",
        "operator CPU seconds per Stack",
        "operator RSS peak (MB)",
        "operator writes per Stack",
        "`pulumi up` per Stack, median (s)",  # the real engine reported its duration
    ):
        figure(doc, many, name)
    assert figure(doc, many, "wall time")["value"] == f"{doc['many_stacks']['apply_to_ready_s']:.1f}"
    per_stack = sum(doc["many_stacks"]["writes"].values()) / 2
    assert figure(doc, many, "operator writes per Stack")["value"] == f"{per_stack:.1f}"
    agent = figure(doc, "Agent start to serving", "agent process start -> first RPC answered")
    assert agent["runs"] == "1" and len(doc["agent"]["serving_s"]) == 1
    one = "One Stack: the operator's overhead per update"
    assert (
        figure(doc, one, "of which `pulumi up` in the workspace")["s"]
        == f"{doc['one_stack']['pulumi_up_s']:.1f}"
    )
    total = figure(doc, "The operator's writes for the 2 Stacks", "**all**", column="verb resource")
    assert total["writes"] == f"**{sum(doc['many_stacks']['writes'].values())}**"
    reads = doc["tables"]["The operator's Secret reads"]  # it GETs each Secret by name, caches none
    assert [r["verb resource"] for r in reads] == ["get secrets", "list secrets", "watch secrets"]
    for row, verb in zip(reads, ("get", "list", "watch"), strict=True):
        counts = [doc[k]["secret_reads"][verb] for k in ("one_stack", "many_stacks")] + [
            doc["startup_secret_reads"][verb]
        ]
        assert [row["one Stack"], row["2 Stacks"], row["start to caches synced"]] == [str(c) for c in counts]
        assert row["per Stack (of the 2)"] == f"{counts[1] / 2:.1f}"
        assert verb == "get" or counts == [0, 0, 0], f"the operator {verb}s Secrets: {row}"
    assert doc["one_stack"]["secret_reads"]["get"] >= 1  # the Update's outputs Secret, at least


@pytest.mark.cluster
@pytest.mark.slow
def test_startup_bench_prints_and_records_each_figure_of_head_from_its_own_tree(tmp_path: Path) -> None:
    path = tmp_path / "startup.json"
    table = run(
        [str(REPO / "hack/bench/startup.py"), "--runs", "1", "--operator-runs", "1", "--idle", "5",
         "--json", str(path)],
        300,
    )  # fmt: skip
    doc = recorded(table, path, "hack/bench/startup.py")
    [revision] = doc["revisions"]
    assert revision["rev"] == "HEAD" and revision["commit"] == doc["commit"]
    label = revision["label"]
    [imported], [operator, idle] = doc["imports"][label], doc["operator"][label]
    # HEAD ran from a worktree of its own, not from this checkout
    assert imported["pko_file"].endswith("/pko/__init__.py") and not imported["pko_file"].startswith(
        f"{REPO}/"
    )
    assert imported["kubernetes_asyncio_modules"] == imported["cryptography_modules"] == 0
    assert imported["modules"] > 300
    heading = "Start-up: `import pko.__main__` and `python -m pko` with no objects"
    assert len(doc["tables"][heading]) == 14
    for name, key, measured, digits in (
        ("`import pko.__main__`: import time (s)", "import_s", imported, 2),
        ("`import pko.__main__`: VmRSS after (MB)", "import_vmrss_mb", imported, 0),
        ("`import pko.__main__`: VmHWM after (MB)", "import_vmhwm_mb", imported, 0),
        ("`import pko.__main__`: modules loaded", "modules", imported, 0),
        ("`import pko.__main__`: of which kubernetes_asyncio's", "kubernetes_asyncio_modules", imported, 0),
        ("`import pko.__main__`: of which cryptography's", "cryptography_modules", imported, 0),
        ("`python -m pko`, no objects: spawn -> ready (s)", "ready_s", operator, 2),
        ("`python -m pko`, no objects: VmRSS at ready (MB)", "ready_vmrss_mb", operator, 0),
        ("`python -m pko`, no objects: VmHWM at ready (MB)", "ready_vmhwm_mb", operator, 0),
        ("`python -m pko`, no objects: CPU at ready (s, children included)", "ready_cpu_s", operator, 2),
        ("`--idle` Stacks: spawn -> leads (s)", "idle_lease_s", idle, 2),
        ("`--idle` Stacks: spawn -> every Stack has a status (s)", "idle_first_pass_s", idle, 2),
        ("`--idle` Stacks: CPU, start-up and first pass (s, children included)", "idle_cpu_s", idle, 2),
        ("`--idle` Stacks: VmRSS after the first pass (MB)", "idle_vmrss_mb", idle, 0),
    ):
        assert doc["medians"][key][label] == measured[key]  # one run: its median is the run
        assert figure(doc, heading, name)[label] == f"{measured[key]:.{digits}f}"
    assert 0 < idle["idle_lease_s"] < idle["idle_first_pass_s"]  # it led, then gave each Stack a status
    assert idle["idle_cpu_s"] > 0 and operator["ready_cpu_s"] > 0  # read from /proc, children included
    assert not Path(imported["pko_file"]).exists()  # the worktree was removed
