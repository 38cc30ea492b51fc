"""The Go tools hack/ builds from their modules (helm, Prometheus, ...), found as the tests need them:
each build script is idempotent and prints its cached output directory last, so the first call builds
(or finds) it and later calls in the process reuse the answer."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

__all__ = ["tool_binary"]

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def _dist(script: str) -> Path:
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / script)], capture_output=True, text=True, timeout=1800, check=False
    )
    assert proc.returncode == 0, f"hack/{script} failed:\n{proc.stderr}"
    return Path(proc.stdout.strip().splitlines()[-1])


def tool_binary(script: str, name: str) -> str:
    """``bin/<name>`` of what ``hack/<script>`` builds (building it on first use)."""
    binary = _dist(script) / "bin" / name
    assert os.access(binary, os.X_OK), f"hack/{script} built no bin/{name} in {binary.parent.parent}"
    return str(binary)
