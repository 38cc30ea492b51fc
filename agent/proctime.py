"""How long ago this agent process started, as the kernel counts it (for the start-up figure it logs).

Measured from the process's own start, not from when Python ran our first line, so interpreter
start-up and imports count. (The agent is a PyInstaller one-folder build: one process, no bootloader
child, so its own start is the start.)
"""

from __future__ import annotations

import os
import time


def seconds_since_start() -> float | None:
    """Seconds since this process started; None where /proc is absent."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime; [0] is field 3
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError):
        return None
