"""kubectl, the one way the tests and the tools run it: :func:`run` (any kubectl binary, any cluster) and
:func:`kubectl` (the test suite's cluster, conftest's ``cluster`` fixture).

A failure raises :class:`KubectlFailed`, which is an ``AssertionError`` (a test's failure) and a
``RuntimeError`` (what the tools catch, and retry through an apiserver restart). The timeout makes a
hung call fail its caller, not the session.

Standard library only: the node tools use it before the virtualenv exists.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class KubectlFailed(AssertionError, RuntimeError):
    """kubectl exited non-zero."""


def run(
    *args: str,
    kubeconfig: Path | str | None = None,
    binary: Path | str = "kubectl",
    input: str | None = None,
    check: bool = True,
    timeout: float = 180,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``binary [--kubeconfig=kubeconfig] args...`` (without ``kubeconfig``: ``env``'s KUBECONFIG);
    its output captured as text."""
    cmd = [str(binary), *([f"--kubeconfig={kubeconfig}"] if kubeconfig is not None else []), *args]
    proc = subprocess.run(
        cmd, input=input, text=True, capture_output=True, timeout=timeout, check=False, env=env
    )
    if check and proc.returncode != 0:
        said = f"{proc.stderr}{proc.stdout}".strip()
        raise KubectlFailed(f"kubectl {' '.join(args)} failed ({proc.returncode}): {said}")
    return proc


def kubectl(
    cluster: Any, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """kubectl (the one on PATH) against the test cluster."""
    return run(*args, kubeconfig=cluster.kubeconfig, input=input, check=check)
