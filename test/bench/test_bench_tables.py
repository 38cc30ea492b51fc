"""The node benches' tables (peer.py, peerscale.py, sidebyside.py) and steady.py's, printed from the figures
their ``--json`` records, on made-up figures (no node): each printed cell is the recorded value as the
table shows it, and sidebyside's JSON holds every row with both operators' values and pko / Go."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import languages
import node
import peer
import peerscale_table
import pytest
import sidebyside
import steady

from pko.devtools.benchrecord import recording

Obj = dict[str, Any]
SUMMARY = "pko beside the Go operator v2.9.0, local node: issue 26's six rows (one run)"
PEER = "Rows 1, 2, 5 and 6 in full (peer.py's table)"
PEERSCALE = "pko beside the Go operator v2.9.0 with many Stacks, local node (one run)"

ROUNDS: peer.Results = {
    "go": {
        "first": [60.0, 62.0],
        "update": [40.0],
        "bare": [10.0],
        "restart": [20.0],
        "operator_restart": [float("inf")],
        "updates_made": [2.0],
        "engine_runs": [2.0],
    },
    "pko": {
        "first": [30.0, 31.0],
        "update": [20.0],
        "bare": [10.0],
        "restart": [8.0],
        "operator_restart": [45.5],
        "updates_made": [1.0],
        "engine_runs": [1.0],
    },
}


def scale(rss: float, requests: float) -> Obj:
    return {
        "background_min": 120.0,
        "background_cpu_pct": 0.5,
        "row3.wall": 138.0,
        "row3.cpu_per_stack": 0.25,
        "row3.requests_per_stack": 80.0,
        "row3.writes_per_stack": 30.0,
        "row3.peak_rss_mb": rss,
        "row3.restarts": 0,
        "idle1000.first_pass": 12.0,
        "idle1000.rss_mb": rss / 2,
        "idle1000.cpu_idle_pct": 1.5,
        "idle1000.requests_min": requests,
        "idle1000.workspaces": 0,
    }


ARGS = Namespace(
    stacks=50,
    idle=[1000],
    idle_seconds=300.0,
    idle_shape="missing-program",
    background_seconds=60.0,
    timeout=1800.0,
)


def record_sidebyside(path: Path) -> Obj:
    operators = {"go": scale(120.0, 2000.0), "pko": scale(90.0, 0.0)}
    with recording("hack/bench/sidebyside.py", path, vars(ARGS), argv=[]) as run:
        run.figures.update(
            summary=sidebyside.summary_table(sidebyside.summary_rows(ROUNDS, operators, ARGS)),
            peer_rows=peer.figure_rows(ROUNDS),
            peerscale_rows=peerscale_table.figure_rows(operators, ARGS),
            peer_rounds=ROUNDS,
            peerscale_operators=operators,
        )
        sidebyside.print_tables(run.figures, ARGS)
    doc: Obj = json.loads(path.read_text())
    return doc


def test_sidebyside_records_every_row_with_both_operators_values_and_the_ratio(tmp_path: Path) -> None:
    doc = record_sidebyside(tmp_path / "sidebyside.json")
    printed = doc["tables"][SUMMARY]
    assert len(printed) == len(doc["summary"]) == 17  # rows 1, 2 (3), 3 (5), 4 (4), 5, 6 (3)
    for shown, row in zip(printed, doc["summary"], strict=True):
        assert shown["row"] == row["row"]
        assert shown["Go operator"] == peerscale_table.cell(row["go"], row["digits"])
        assert shown["pko"] == peerscale_table.cell(row["pko"], row["digits"])
    wall = next(r for r in doc["summary"] if r["row"].startswith("3. 50 Program Stacks"))
    assert (wall["go"], wall["pko"]) == (138.0, 138.0) and wall["ratio"] == 1.0
    rss = next(r for r in doc["summary"] if r["row"] == "3. operator peak RSS, MB")
    assert rss["ratio"] == pytest.approx(0.75)
    assert next(s for s in printed if s["row"] == rss["row"])["pko / Go"] == "0.75"
    idle = next(r for r in doc["summary"] if r["row"] == "4. 1,000 idle: API requests/min")
    assert (idle["go"], idle["pko"], idle["ratio"]) == (2000.0, 0.0, 0.0)
    counts = next(r for r in doc["summary"] if r["row"].startswith("6. Updates that change made"))
    assert counts["ratio"] is None
    assert next(s for s in printed if s["row"] == counts["row"])["pko / Go"] == ""
    overhead = next(r for r in doc["summary"] if r["row"] == "2. operator overhead per update, s")
    assert (overhead["go"], overhead["pko"]) == (30.0, 10.0)


def test_sidebyside_records_peers_and_peerscales_full_tables_and_the_figures_behind_them(
    tmp_path: Path,
) -> None:
    doc = record_sidebyside(tmp_path / "sidebyside.json")
    assert doc["peer_rounds"]["pko"]["first"] == [30.0, 31.0]
    assert doc["peerscale_operators"]["go"]["row3.peak_rss_mb"] == 120.0
    restart = doc["tables"][PEER][5]
    assert restart["figure"].startswith("operator pod deleted 3 s into a 30 s update")
    assert (restart["Go operator"], restart["pko"], restart["pko / Go"]) == ("inf", "45.5", "-")
    assert doc["peer_rows"][5]["go"] == "inf" and doc["peer_rows"][5]["ratio"] is None  # strict JSON
    assert doc["tables"][PEER][0] == {
        "figure": "Program Stack applied -> Ready (first deploy, workspace pod included)",
        "Go operator": "61.0",
        "pko": "30.5",
        "pko / Go": "0.50",
    }
    assert doc["tables"][PEER][-1]["Go operator"] == "[2.0]"  # engine runs per round, as printed
    scale_rows = doc["tables"][PEERSCALE]
    assert len(scale_rows) == len(doc["peerscale_rows"])
    missing = next(r for r in scale_rows if r["figure"].startswith("1,000 idle: of which until the new pod"))
    assert (missing["Go operator"], missing["pko"], missing["pko / Go"]) == ("-", "-", "-")
    workspaces = next(r for r in scale_rows if r["figure"].startswith("1,000 idle: Workspaces"))
    assert (workspaces["Go operator"], workspaces["pko / Go"]) == ("0", "")


def test_steady_write_deltas_leave_out_what_did_not_change_and_end_with_the_sum() -> None:
    before = {("PATCH", "stacks/status"): 10.0, ("PUT", "leases"): 4.0}
    after = {("PATCH", "stacks/status"): 10.0, ("PUT", "leases"): 9.0, ("POST", "events"): 2.0}
    assert steady.write_deltas(before, after) == [
        {"verb": "POST", "resource": "events", "writes": 2.0},
        {"verb": "PUT", "resource": "leases", "writes": 5.0},
        {"verb": "all", "resource": "all", "writes": 7.0},
    ]


def test_steadys_probe_rows_show_each_endpoint_and_a_heartbeat_age_not_exported_as_n_a() -> None:
    probes = {
        "healthz": {"slowest_s": 0.051, "over_1s": 0, "failed": 0, "sampled": 60},
        "metrics": {"slowest_s": 1.234, "over_1s": 2, "failed": 1, "sampled": 58},
        "heartbeat_age_max_s": None,
    }
    assert steady.probe_rows(probes) == [
        "| first pass: slowest /healthz answer (s) | 0.05 | < 1 |",
        "| first pass: /healthz answers over 1 s / failed / sampled | 0 / 0 / 60 | 0 / 0 / - |",
        "| first pass: slowest /metrics answer (s) | 1.23 | < 1 |",
        "| first pass: /metrics answers over 1 s / failed / sampled | 2 / 1 / 58 | 0 / 0 / - |",
        "| first pass: largest event-loop heartbeat age (s) | n/a | < 60 (liveness) |",
    ]


def test_nodes_tables_show_the_medians_of_the_recorded_restarts_and_updates(tmp_path: Path) -> None:
    restarts = [
        {"serving": 2.5, "ready": 3.5, "startup": 0.45, "init": 1.0, "main": 2.0},
        {"serving": 2.7, "ready": 3.3, "startup": 0.50, "init": 1.0, "main": 2.0},
        {"serving": 2.6, "ready": 3.4, "startup": 0.48, "init": 2.0, "main": 3.0},
    ]
    steps = [("Stack patched (answered)", 0.02, 0.02), ("Stack Ready for the new generation", 33.9, 33.88)]
    updates = [
        {"wall": 34.0, "up": 33.4, "timeline": steps},
        {"wall": 30.0, "up": 29.0, "timeline": []},
        {"wall": 40.0, "up": 35.0, "timeline": []},
    ]
    path = tmp_path / "node.json"
    with recording("hack/bench/node.py", path, argv=[]) as run:
        run.figures.update(restarts=restarts, updates=updates)
        node.print_tables(run.figures)
    doc = json.loads(path.read_text())
    serving = doc["tables"]["Workspace pod created -> agent serving (3 restarts, medians)"]
    assert {"figure": "pod created -> agent logs `server listening`", "s": "2.60"} in serving
    init = "pod created -> init containers done (bootstrap copy, program fetch; whole s)"
    assert {"figure": init, "s": "1.0"} in serving
    update = doc["tables"]["One update, apply -> Ready (3 updates, medians)"]
    assert {"figure": "the operator's overhead per update", "s": "0.60 (1.02x the up)"} in update
    timeline = doc["tables"]["The median update's timeline (34.00 s, its up 33.40 s)"]
    assert timeline[1] == {
        "step": "Stack Ready for the new generation",
        "s since the patch": "33.90",
        "s since the step before": "33.88",
    }
    assert doc["updates"][0]["timeline"][1] == ["Stack Ready for the new generation", 33.9, 33.88]


def test_languages_tables_show_each_programs_figures_and_each_images_size(tmp_path: Path) -> None:
    programs = {
        "yaml": {
            "first": 20.04,
            "first_up": 3.0,
            "serving": 2.6,
            "update": 3.5,
            "update_up": 2.9,
            "new_pod_update": 4.1,
            "new_pod_update_up": 1.8,
        },
        "yaml (core image)": {"first": 15.0, "first_up": 2.9, "serving": 2.1},
    }
    images = [
        {"image": "core: YAML and Python (--target core)", "archive_bytes": 210e6, "unpacked_bytes": 640e6}
    ]
    path = tmp_path / "languages.json"
    with recording("hack/bench/languages.py", path, argv=[]) as run:
        run.figures.update(updates_per_language=2, programs=programs, images=images)
        languages.print_tables(run.figures)
    doc = json.loads(path.read_text())
    rows = doc["tables"]["The same ConfigMap in every language, on the local node, real Pulumi engine"]
    assert rows[0] == {
        "program": "yaml",
        "apply -> Ready (first deploy)": "20.0",
        "its `pulumi up`": "3.0",
        "pod created -> agent serving": "2.6",
        "config change -> Ready": "3.5",
        "its `pulumi up` (2)": "2.9",  # the column printed twice: the config change's up
        "in a new pod: config change -> Ready": "4.1",
        "its `pulumi up` (3)": "1.8",  # and thrice: the up in the new pod
    }
    assert rows[1]["config change -> Ready"] == "-"
    assert rows[1]["in a new pod: config change -> Ready"] == "-"
    assert doc["tables"]["Workspace images"] == [
        {
            "workspace image": "core: YAML and Python (--target core)",
            "archive (pulled)": "210 MB",
            "unpacked": "640 MB",
        }
    ]
