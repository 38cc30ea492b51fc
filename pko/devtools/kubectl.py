"""Helpers for tests that talk to the test cluster (imported by conftest.py and test modules)."""

from __future__ import annotations

import subprocess
from typing import Any


def kubectl(
    cluster: Any, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """kubectl against the test cluster; the timeout makes a hung call fail its test, not the session."""
    cmd = ["kubectl", f"--kubeconfig={cluster.kubeconfig}", *args]
    proc = subprocess.run(cmd, input=input, text=True, capture_output=True, timeout=180, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc
