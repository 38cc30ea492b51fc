"""How long ago this agent process started, as the kernel counts it (for the startup figure it logs).

Measured from the process's own start, not from when Python ran our first line, so interpreter
start-up and imports count. A PyInstaller one-file executable runs as two processes: a bootloader
that unpacks the bundle, then a child of the same executable that runs Python; its start counts from
the bootloader's.
"""

from __future__ import annotations

import os
import sys
import time


def _started_since_boot(pid: int | str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime; [0] is field 3


def _exe(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def seconds_since_start() -> float | None:
    """Seconds since this process (or its one-file bootloader) started; None where /proc is absent."""
    try:
        pid: int | str = "self"
        parent = os.getppid()
        if getattr(sys, "frozen", False) and parent > 1 and _exe(parent) == _exe("self"):
            pid = parent  # a one-file bundle's bootloader (a plain interpreter's parent may be one too)
        return time.clock_gettime(time.CLOCK_BOOTTIME) - _started_since_boot(pid)
    except (OSError, ValueError, IndexError):
        return None
