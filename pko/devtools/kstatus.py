"""What kstatus (sigs.k8s.io/cli-utils, the library Flux's health checks, `flux --wait` and kpt read
resources with; built by hack/build-kstatus.sh) computes for objects as the operator wrote
them: ``Current``, ``InProgress``, ``Failed``, ..."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from pko.devtools.builds import tool_binary

__all__ = ["kstatus"]


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's status of ``obj`` (a whole object read from the API)."""
    proc = subprocess.run(
        [tool_binary("build-kstatus.sh", "kstatus")],
        input=json.dumps(obj), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    status: str = json.loads(proc.stdout)["status"]
    return status
