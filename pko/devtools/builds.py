"""What the hack/build-*.sh scripts build, found as tools, tests and benches need it.

Each script is idempotent (it builds only what its cache lacks, so a second run is instant) and prints
its output directory (or file) last on stdout: :func:`built` runs one and returns that path, the one
way the repository reads a build script's answer. :func:`tool_binary` is a Go tool's ``bin/<name>``,
remembered per process: it runs a script with no arguments, whose answer cannot change.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BuildError", "built", "tool_binary"]

REPO = Path(__file__).resolve().parents[2]
STDERR_TAIL = 4000  # enough of a failed build's log to see why, not the whole of it


class BuildError(subprocess.CalledProcessError):
    """A build script failed (or printed nothing): a CalledProcessError whose message has the end of
    the script's stderr when it was captured."""

    def __str__(self) -> str:
        script = f"hack/{Path(self.cmd[1]).name}"
        if self.returncode == 0:
            return f"{script} printed no path"
        said = f": {self.stderr.strip()[-STDERR_TAIL:]}" if self.stderr else " (its stderr is above)"
        return f"{script} failed (exit {self.returncode}){said}"


def built(
    script: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    show_stderr: bool = False,
) -> Path:
    """The path ``hack/<script> <args>`` prints last, building what its cache lacks.

    ``env`` is added to this process's environment. The script's stderr (its progress) is captured for
    the error unless ``show_stderr``, for a build of minutes a person watches. Not cached: a script
    given other arguments or environment answers otherwise.
    """
    cmd = ["bash", str(REPO / "hack" / script), *args]
    proc = subprocess.run(
        cmd,
        env={**os.environ, **env} if env is not None else None,
        stdout=subprocess.PIPE,
        stderr=None if show_stderr else subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise BuildError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return Path(lines[-1])


@functools.cache
def _dist(script: str) -> Path:
    return built(script, timeout=1800)


def tool_binary(script: str, name: str) -> str:
    """``bin/<name>`` of what ``hack/<script>`` builds (building it on first use)."""
    binary = _dist(script) / "bin" / name
    assert os.access(binary, os.X_OK), f"hack/{script} built no bin/{name} in {binary.parent.parent}"
    return str(binary)
