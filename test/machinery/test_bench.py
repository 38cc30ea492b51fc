"""The benchmark command runs end to end at tiny sizes and prints its tables (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.slow
def test_bench_command_prints_every_table_at_tiny_sizes() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/bench/run.py"), "--sizes", "20", "--stacks", "20",
         "--contenders", "bare,ours", "--wq-rounds", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout
    assert "## Workqueue" in table and "| batch |" in table
    assert "| 20 | bare kubernetes-asyncio loop (anchor) |" in table
    assert "| 20 | pko machinery (Manager, 25 workers) |" in table
    assert "| pko informer (default transform) (20) |" in table


@pytest.mark.cluster
@pytest.mark.slow
def test_steady_state_bench_prints_its_figures_at_tiny_size() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/bench/steady.py"), "--stacks", "50", "--duration", "10",
         "--quiet", "5", "--buckets", "5", "--teams", "5", "--resync", "60"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout
    assert "| operator RSS at end (MB) |" in table
    assert "| operator CPU % of one core over the window |" in table
    assert "Ready pods" in table
    assert "| bucket start s | reconciles |" in table
    assert "resync spread:" in table
    assert "| verb | resource | writes |" in table
    assert "Secrets/ConfigMaps cached: no" in table


@pytest.mark.cluster
@pytest.mark.slow
def test_deploy_bench_prints_writes_per_stack_and_the_floor_at_tiny_size() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "hack/bench/deploy.py"), "--stacks", "2", "--timeout", "300",
         "--agent-runs", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout
    assert "## Writes per deployed Stack" in table
    assert "| create updates | 1 | 1.0 |" in table  # one Update for one deployed Stack
    assert "| operator / floor |" in table
    assert "| operator CPU seconds per Stack |" in table
    assert "| agent process start -> first RPC answered (goal 0.5 s) |" in table
    assert "| of which `pulumi up` in the workspace" in table  # the real engine reported its duration
    assert "| `pulumi up` per Stack, median (s) |" in table
