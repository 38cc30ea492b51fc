"""The reduced fault matrix (issue 28) on the real node and engine: the cells of ``hack/chaos.py
--reduced``, one test each, judged as the full matrix judges them (see pko/devtools/chaos): the Stack Ready
(or gone after a destroy) within the bound, one successful Update for the change, every command of the
program run once (the witness log on the node's disk), and no lock, pending operation or stray
resource in the state backend (the file backend on a claim, or SeaweedFS through S3).

The full matrix is one command: ``sudo python3 hack/chaos.py`` on a node from ``hack/up.sh``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from pko.devtools.chaos.cells import Cell, teardown
from pko.devtools.chaos.faults import REDUCED
from pko.devtools.chaos.kube import REPO
from pko.devtools.chaos.report import table
from pko.devtools.chaos.rounds import run

from .conftest import Kube

pytestmark = [
    pytest.mark.timeout(1500),
    pytest.mark.pko_only("the matrix reads pko's Update labels and request annotations"),
]


@pytest.fixture(scope="module")
def matrix(kube: Kube, seaweedfs_image: None) -> Iterator[Kube]:
    """The cells' namespace and the S3 store (its image imported: ``seaweedfs_image``), removed after
    the last cell (other modules apply the S3 sample themselves)."""
    yield kube
    teardown()


@pytest.mark.parametrize(("fault", "operation", "backend"), REDUCED)
def test_fault_during_operation_loses_and_repeats_nothing(
    matrix: Kube, fault: str, operation: str, backend: str
) -> None:
    cell = Cell(fault, operation, backend)
    run([cell], step_seconds=5, bound=600)
    figures = REPO / ".bench-logs" / "chaos-e2e.jsonl"
    figures.parent.mkdir(parents=True, exist_ok=True)
    with figures.open("a") as f:  # the figures of every run, kept for docs/fault-matrix.md's table
        f.write(json.dumps(asdict(cell)) + "\n")
    assert cell.outcome == "pass", table([cell]) + "\n" + matrix.diagnose()
